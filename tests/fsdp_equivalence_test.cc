// FSDP training with N = 1, 2, 3, 4 ranks must equal single-process training
// on the same global batch: same loss at every step, same parameters at the
// end. float64 runs make the comparison tight enough that any protocol error
// (a wrong shard, a missing or doubled gradient, a stale parameter) shows;
// float32 and bf16 runs check the bounds users will see.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/comm/world.h"
#include "tests/harness/multi_process.h"
#include "tests/training_util.h"

namespace fsdp2 {
namespace testing {
namespace {

FSDP2_SCENARIO(train) {
  auto spec = TrainSpec::FromArgs(args);
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  TrainOutput out = TrainSharded(spec, world);
  WriteOutput(WorkerOutDir() + "/rank" + std::to_string(world->rank()) + ".txt",
              out);
}

// Runs `spec` on `world` ranks; returns every rank's output.
std::vector<TrainOutput> RunSharded(const TrainSpec& spec, int world) {
  LaunchResult r = LaunchScenario("train", world, spec.ToArgs(), std::chrono::seconds(240));
  if (!r.ok()) {
    ADD_FAILURE() << spec.Name() << " on " << world << " ranks failed:\n"
                  << r.Describe();
    return {};
  }
  std::vector<TrainOutput> outs;
  for (int rank = 0; rank < world; ++rank) {
    outs.push_back(
        ReadOutput(r.out_dir + "/rank" + std::to_string(rank) + ".txt"));
  }
  return outs;
}

struct Bounds {
  double loss_rel;
  double param_abs;  // negative: parameters are not compared
};

// Compares every rank of an N-rank run with the reference, for N = 1..4.
void ExpectEquivalent(const TrainSpec& spec, Bounds bounds,
                      std::vector<int> worlds = {1, 2, 3, 4}) {
  for (int n : worlds) {
    TrainOutput ref = TrainReference(spec, n);
    auto outs = RunSharded(spec, n);
    if (outs.empty()) continue;
    for (size_t rank = 0; rank < outs.size(); ++rank) {
      const double loss_diff = MaxLossRelDiff(outs[rank], ref, 1e-3);
      std::string worst_param;
      const double param_diff = MaxParamAbsDiff(outs[rank], ref, &worst_param);
      if (rank == 0) {
        std::printf("%-40s N=%d  max loss rel diff %.3g  max param abs diff "
                    "%.3g (%s)  final loss %.6f\n",
                    spec.Name().c_str(), n, loss_diff, param_diff,
                    worst_param.c_str(), ref.losses.back());
      }
      EXPECT_LE(loss_diff, bounds.loss_rel)
          << spec.Name() << " N=" << n << " rank " << rank;
      if (bounds.param_abs >= 0) {
        EXPECT_LE(param_diff, bounds.param_abs)
            << spec.Name() << " N=" << n << " rank " << rank;
      }
      ASSERT_EQ(outs[rank].grad_norms.size(), ref.grad_norms.size());
      for (size_t i = 0; i < ref.grad_norms.size(); ++i) {
        EXPECT_NEAR(outs[rank].grad_norms[i], ref.grad_norms[i],
                    1e-9 * ref.grad_norms[i])
            << spec.Name() << " N=" << n << " step " << i;
      }
      // After the optimizer step only shards remain.
      EXPECT_EQ(outs[rank].stats.unsharded_param_bytes, 0)
          << spec.Name() << " N=" << n;
      EXPECT_EQ(outs[rank].stats.unsharded_grad_bytes, 0);
    }
  }
}

constexpr Bounds kFloat64{1e-11, 1e-10};

class Float64Equivalence
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Float64Equivalence, MatchesSingleProcessTraining) {
  TrainSpec spec;
  spec.model = std::get<0>(GetParam());
  spec.strategy = std::get<1>(GetParam());
  ExpectEquivalent(spec, kFloat64);
}

INSTANTIATE_TEST_SUITE_P(
    ModelsAndStrategies, Float64Equivalence,
    ::testing::Combine(::testing::Values("gpt", "mlp", "conv", "tied"),
                       ::testing::Values("full_shard", "shard_grad_op",
                                         "no_shard", "hybrid_shard")),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param);
    });

TEST(Equivalence, GradientAccumulationEqualsOneLargerBatch) {
  for (const char* strategy : {"full_shard", "no_shard", "hybrid_shard"}) {
    TrainSpec spec;
    spec.strategy = strategy;
    spec.grad_accum = 3;
    spec.steps = 5;
    ExpectEquivalent(spec, kFloat64, {1, 2, 3, 4});
  }
}

// The optimizer only ever sees local shards, so any stock optimizer works
// and holds sharded state.
TEST(Equivalence, OtherStockOptimizers) {
  for (const char* optimizer : {"adam", "sgd"}) {
    TrainSpec spec;
    spec.optimizer = optimizer;
    ExpectEquivalent(spec, kFloat64);
  }
}

TEST(Equivalence, ClippingUsesTheGlobalNorm) {
  for (const char* strategy : {"full_shard", "hybrid_shard"}) {
    TrainSpec spec;
    spec.strategy = strategy;
    spec.clip = 0.05;  // small enough that every step clips
    ExpectEquivalent(spec, kFloat64);
  }
}

// fp32: reductions sum in a different order than one large matmul does, so
// gradients differ in the last bits. Losses stay within 1e-5. Parameters can
// drift further: AdamW normalises each update to about lr, so a gradient
// element that is rounding noise on both sides can move by up to lr per step
// in different directions. The bound is 1% of that worst case (lr * steps =
// 0.1); the measured worst case (printed) is about 3e-4.
TEST(Equivalence, Float32WithinRoundingOfSingleProcess) {
  TrainSpec spec;
  spec.dtype = "float32";
  ExpectEquivalent(spec, Bounds{1e-5, 1e-3});
}

// bf16 all-gather and compute, fp32 reduction and master weights, against a
// pure fp32 single-process run: the loss curve must track fp32 within 2%
// (measured: under 0.4% over 10 steps). Parameters are not compared: bf16
// rounds activations to 8 bits of mantissa, and AdamW turns that into
// update-direction changes of order lr on small gradients.
TEST(Equivalence, Bf16MixedPrecisionTracksFloat32) {
  TrainSpec spec;
  spec.dtype = "float32";
  spec.mixed_precision = "bf16";
  ExpectEquivalent(spec, Bounds{2e-2, -1}, {1, 2, 4});
}

// ---- fully_shard's controls (FSDPOptions, set_requires_all_reduce): each
// changes when and how the ranks communicate, never what they compute.

// Accumulation that reduce-scatters every micro-batch and all-reduces
// across the replicas only at the last (HYBRID_SHARD at N = 4 has 2
// replicas; NO_SHARD replicates over every rank) gives one larger batch.
TEST(Controls, ReduceScatterEachMicroBatchEqualsOneLargerBatch) {
  for (const char* strategy : {"hybrid_shard", "no_shard", "full_shard"}) {
    TrainSpec spec;
    spec.strategy = strategy;
    spec.grad_accum = 3;
    spec.steps = 5;
    spec.controls = "rs";
    ExpectEquivalent(spec, kFloat64);
  }
}

// Prefetch depths 0 (none) to 3 (more than the tiny GPT's two blocks ahead),
// forward and backward apart, with every strategy and with activation
// checkpointing: the same collectives in another order.
TEST(Controls, PrefetchDepthsLeaveTrainingUnchanged) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"full_shard", "fp=0,bp=0"}, {"full_shard", "fp=2,bp=3"},
      {"shard_grad_op", "fp=3,bp=2"}, {"hybrid_shard", "fp=2,bp=2"},
      {"no_shard", "fp=0,bp=2"}};
  for (const auto& [strategy, controls] : cases) {
    TrainSpec spec;
    spec.strategy = strategy;
    spec.steps = 4;
    spec.controls = controls;
    ExpectEquivalent(spec, kFloat64);
  }
  TrainSpec ac;
  ac.steps = 4;
  ac.ac = "full";
  ac.controls = "fp=2,bp=2";
  ExpectEquivalent(ac, kFloat64, {2, 3});
}

// Explicit prefetch lists in place of the depths: the root's forward
// all-gathers the last block before the first, its backward (it is still
// unsharded then, so nothing of its own is gathered) the first block
// before the last; a block's empty list; lists with the depths at 0;
// with every strategy, partial resharding and activation checkpointing.
TEST(Controls, ExplicitPrefetchListsLeaveTrainingUnchanged) {
  const std::vector<std::tuple<std::string, std::string, std::string, std::vector<int>>> cases =
      {{"full_shard", "fl=r:1+0,bl=r:0+1", "none", {1, 2, 3, 4}},
       {"full_shard", "fp=0,bp=0,fl=0:1,bl=1:0", "none", {2, 3}},
       {"full_shard", "fl=0:,bl=1:,bl=r:1", "none", {2}},
       {"shard_grad_op", "fl=r:1+0,bl=r:0+1", "none", {3}},
       {"hybrid_shard", "fl=r:1,bl=1:0", "none", {4}},
       {"no_shard", "fl=r:0+1,bl=r:1+0", "none", {2}},
       {"full_shard", "raf=2,fl=r:1+0,bl=r:0+1,bl=1:0", "full", {4}}};
  for (const auto& [strategy, controls, ac, worlds] : cases) {
    TrainSpec spec;
    spec.strategy = strategy;
    spec.steps = 4;
    spec.grad_accum = 2;
    spec.ac = ac;
    spec.controls = controls;
    ExpectEquivalent(spec, kFloat64, worlds);
  }
}

// Resharding after forward only down to blocks of K ranks (hpZ): backward
// all-gathers inside each block from the rows kept there. K = 1 is full
// resharding and K = the shard group size none; with activation
// checkpointing, accumulation and every strategy that shards.
TEST(Controls, PartialReshardAfterForward) {
  const std::vector<std::tuple<std::string, std::string, int, std::string, std::vector<int>>>
      cases = {{"full_shard", "raf=2", 1, "none", {2, 4}},
               {"full_shard", "raf=1", 1, "none", {1, 2, 3, 4}},
               {"full_shard", "raf=3", 1, "none", {3}},
               {"shard_grad_op", "raf=2", 2, "none", {4}},
               {"hybrid_shard", "raf=1", 1, "none", {4}},
               {"full_shard", "raf=2,fp=2,bp=2", 2, "full", {4}}};
  for (const auto& [strategy, controls, accum, ac, worlds] : cases) {
    TrainSpec spec;
    spec.strategy = strategy;
    spec.steps = 4;
    spec.grad_accum = accum;
    spec.ac = ac;
    spec.controls = controls;
    ExpectEquivalent(spec, kFloat64, worlds);
  }
}

// ---- What the controls change, from the engine's own counts (the tiny
// GPT: two blocks and the root; every rank of a run sees the same).

// Rank 0's output of `spec` on `world` ranks (every rank checked alike by
// the callers through the equal-by-construction counts).
TrainOutput RunRank0(const TrainSpec& spec, int world) {
  auto outs = RunSharded(spec, world);
  return outs.empty() ? TrainOutput() : outs[0];
}

// SHARD_GRAD_OP keeps each unit's parameters unsharded from forward to
// backward: one all-gather per unit per step, where FULL_SHARD gathers each
// block again for its backward; one reduction per unit per step either way.
TEST(Controls, ShardGradOpGathersEachUnitOncePerStep) {
  for (int n : {2, 3}) {
    TrainSpec spec;
    spec.steps = 3;
    spec.strategy = "shard_grad_op";
    const TrainOutput sgo = RunRank0(spec, n);
    spec.strategy = "full_shard";
    const TrainOutput full = RunRank0(spec, n);
    ASSERT_EQ(sgo.all_gathers.size(), 3u) << "two blocks and the root";
    ASSERT_EQ(full.all_gathers.size(), 3u);
    for (size_t u = 0; u < 3; ++u) {
      const bool root = u == 2;
      EXPECT_EQ(sgo.all_gathers[u], 3) << "SHARD_GRAD_OP N=" << n << " unit " << u;
      EXPECT_EQ(sgo.reductions[u], 3) << "SHARD_GRAD_OP N=" << n << " unit " << u;
      EXPECT_EQ(full.all_gathers[u], root ? 3 : 6) << "FULL_SHARD N=" << n << " unit " << u;
      // After forward: everything still unsharded with SHARD_GRAD_OP, only
      // the root (which never reshards after forward) with FULL_SHARD.
      EXPECT_GT(sgo.after_forward_unsharded[u], 0) << "SHARD_GRAD_OP N=" << n << " unit " << u;
      EXPECT_EQ(full.after_forward_unsharded[u], root ? sgo.after_forward_unsharded[u] : 0)
          << "FULL_SHARD N=" << n << " unit " << u;
    }
  }
}

// Prefetching holds the next units' parameters beside the running one's:
// with forward (or backward) prefetch 2 the unsharded peak is the root and
// both blocks, with neither prefetch the root and one block.
TEST(Controls, PrefetchRaisesTheUnshardedPeak) {
  TrainSpec spec;
  spec.steps = 2;
  spec.strategy = "shard_grad_op";  // every unit's unsharded bytes, after forward
  const TrainOutput sizes = RunRank0(spec, 2);
  ASSERT_EQ(sizes.after_forward_unsharded.size(), 3u);
  const int64_t block0 = sizes.after_forward_unsharded[0], block1 = sizes.after_forward_unsharded[1];
  const int64_t root = sizes.after_forward_unsharded[2];
  spec.strategy = "full_shard";
  int64_t peak[3];  // none, forward 2, backward 2
  const char* controls[3] = {"fp=0,bp=0", "fp=2,bp=0", "fp=0,bp=2"};
  for (int i = 0; i < 3; ++i) {
    spec.controls = controls[i];
    peak[i] = RunRank0(spec, 2).peak_unsharded_bytes;
    std::printf("%s: peak unsharded %lld B (root %lld B, blocks %lld B and %lld B)\n",
                controls[i], static_cast<long long>(peak[i]), static_cast<long long>(root),
                static_cast<long long>(block0), static_cast<long long>(block1));
  }
  EXPECT_EQ(peak[0], root + std::max(block0, block1)) << "no prefetch: one block at a time";
  EXPECT_EQ(peak[1], root + block0 + block1) << "forward prefetch 2";
  EXPECT_EQ(peak[2], root + block0 + block1) << "backward prefetch 2";
  EXPECT_GT(peak[1], peak[0]);
  EXPECT_GT(peak[2], peak[0]);
}

// Resharding after forward down to blocks of K ranks (hpZ) leaves each rank
// 1/K of every unit's parameters (the K ranks of a block hold one copy
// between them), which backward gathers again inside the block; K = 1
// leaves nothing, K = the shard group everything (no second all-gather).
// Set explicitly, the size applies to the root too (by default the root
// keeps its parameters for backward).
TEST(Controls, PartialReshardKeepsOneKthOfEachUnitAfterForward) {
  std::vector<TrainOutput> runs;  // K = 1, 2, 4 on 4 ranks
  for (const char* controls : {"raf=1", "raf=2", "raf=4"}) {
    TrainSpec spec;
    spec.steps = 2;
    spec.controls = controls;
    runs.push_back(RunRank0(spec, 4));
    ASSERT_EQ(runs.back().after_forward_unsharded.size(), 3u) << controls;
  }
  for (size_t u = 0; u < 3; ++u) {
    const int64_t whole = runs[2].after_forward_unsharded[u];
    EXPECT_GT(whole, 0) << "unit " << u;
    EXPECT_EQ(runs[0].after_forward_unsharded[u], 0) << "K=1, unit " << u;
    EXPECT_EQ(runs[1].after_forward_unsharded[u], whole / 2) << "K=2, unit " << u;
    EXPECT_EQ(runs[0].all_gathers[u], 4) << "K=1, unit " << u;
    EXPECT_EQ(runs[1].all_gathers[u], 4) << "K=2, unit " << u;
    EXPECT_EQ(runs[2].all_gathers[u], 2) << "K=4, unit " << u;
  }
}

// A divide factor of 1 sums the ranks' gradients: one process with its loss
// scaled by the world size takes the same SGD steps; with clipping and
// accumulation too.
TEST(Controls, GradientDivideFactor) {
  for (const char* strategy : {"full_shard", "hybrid_shard"}) {
    TrainSpec spec;
    spec.strategy = strategy;
    spec.optimizer = "sgd";
    spec.steps = 4;
    spec.controls = "div=1";
    ExpectEquivalent(spec, kFloat64);
  }
  TrainSpec spec;
  spec.optimizer = "sgd";
  spec.steps = 4;
  spec.grad_accum = 2;
  spec.clip = 0.05;
  spec.strategy = "hybrid_shard";
  spec.controls = "rs,div=3";
  ExpectEquivalent(spec, kFloat64);
}

// Ignored parameters stay whole on every rank; FSDP leaves their gradient
// alone and the training loop all-reduces it: one process again, for a
// parameter of a block unit and one of the root, under accumulation and
// clipping.
TEST(Controls, IgnoredParametersAreLeftToTheUser) {
  for (const char* strategy : {"full_shard", "hybrid_shard", "shard_grad_op"}) {
    for (const char* name : {"blocks.1.fc.weight", "wpe.weight"}) {
      TrainSpec spec;
      spec.strategy = strategy;
      spec.steps = 4;
      spec.grad_accum = 2;
      spec.clip = 0.05;
      spec.controls = std::string("ignore=") + name;
      ExpectEquivalent(spec, kFloat64, {1, 2, 4});
    }
  }
}

// An ignored parameter inside a block whose activations are recomputed in
// backward gets its gradient from the recomputation, as the block's own
// parameters do: one process again, in float64.
TEST(Controls, IgnoredParametersOfCheckpointedBlocksGetGradients) {
  TrainSpec spec;
  spec.steps = 3;
  spec.ac = "full";
  spec.controls = "ignore=blocks.1.fc.weight";
  ExpectEquivalent(spec, kFloat64, {1, 2});
}

// An ignored parameter inside a block under bf16 mixed precision: cast to
// bf16 with its block (a float32 weight does not multiply bf16
// activations), its float32 value, gradient and step kept: tracks the
// float32 one-process run as bf16 does (Bf16MixedPrecisionTracksFloat32's
// bound), with the activations of the checkpointed blocks recomputed too.
TEST(Controls, IgnoredParameterInsideABlockUnderBf16) {
  for (const char* ac : {"none", "full"}) {
    TrainSpec spec;
    spec.dtype = "float32";
    spec.mixed_precision = "bf16";
    spec.steps = 4;
    spec.ac = ac;
    spec.controls = "ignore=blocks.1.fc.weight";
    ExpectEquivalent(spec, Bounds{2e-2, -1}, {1, 2, 4});
  }
}

// Sharded state falls as 1/N: per-rank parameter and gradient bytes are at
// most ceil(total / N) rows of every parameter.
TEST(Equivalence, ShardedBytesFallAsOneOverN) {
  TrainSpec spec;
  spec.dtype = "float32";
  spec.steps = 2;
  int64_t full_bytes = 0;
  for (int n : {1, 2, 4}) {
    auto outs = RunSharded(spec, n);
    ASSERT_EQ(static_cast<int>(outs.size()), n);
    if (n == 1) full_bytes = outs[0].stats.sharded_param_bytes;
    EXPECT_EQ(outs[0].stats.total_param_numel * 4, full_bytes);
    int64_t sum = 0;
    for (int rank = 0; rank < n; ++rank) {
      const auto& s = outs[rank].stats;
      std::printf("N=%d rank %d: sharded params %lld B, sharded grads %lld B, "
                  "peak unsharded params %lld B (model %lld B)\n",
                  n, rank, (long long)s.sharded_param_bytes,
                  (long long)s.sharded_grad_bytes,
                  (long long)outs[rank].peak_unsharded_bytes,
                  (long long)full_bytes);
      // Padding adds at most one row per parameter; the tiny GPT's rows are
      // at most 128 floats and it has 26 parameters.
      EXPECT_LE(s.sharded_param_bytes, full_bytes / n + 26 * 128 * 4);
      EXPECT_EQ(s.sharded_grad_bytes, s.sharded_param_bytes);
      sum += s.sharded_param_bytes;
    }
    EXPECT_EQ(sum, full_bytes) << "shards must partition the model";
  }
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
