// CPU offload (FSDP2StrategyOptions::cpu_offload) on the CPU, where the CPU
// stands in for the device: every step of the offload path runs (shards
// copied to a buffer of their own before the all-gather, each unit's
// reduced gradients copied to host tensors and handed to the host
// optimizer, which steps the unit on its worker thread while backward goes
// on), and training must equal training without offload bit for bit, on
// 1-4 ranks, under every sharding strategy, with gradient accumulation and
// clipping, from a deferred build, with activation checkpointing and
// frozen parameters, and across checkpoints saved with and loaded without
// it (and the other way round). The copies and streams of a GPU are
// tests/gpu_test.cc's.
//
// Besides equality, what offload changes is asserted: the parameters move
// during backward() (the per-unit steps) when the backward is told there is
// no clipping, not when it is told a norm; no gradient is left on .grad
// after such a backward; the units hand their gradients over in backward
// order; and at one rank in the parameters' dtype, where the parameters
// alias the shards without offload, offload all-gathers into a buffer of
// its own.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/fsdp/fully_shard.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/micro_batch_step.h"
#include "tests/harness/multi_process.h"
#include "tests/strategy_util.h"

namespace fsdp2 {
namespace testing {
namespace {

using strategy::Batch;

constexpr uint64_t kSeed = 17;
constexpr uint64_t kSamplerSeed = 3;
constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks
constexpr int64_t kRows = 48;
constexpr int kSteps = 3;

Batch Dataset() { return TokenWindows(TinyGPT().vocab_size, kRows); }

// key=value arguments of a scenario, with defaults.
struct Args {
  explicit Args(const std::vector<std::string>& args) {
    for (const auto& a : args) {
      const size_t eq = a.find('=');
      values[a.substr(0, eq)] = eq == std::string::npos ? "1" : a.substr(eq + 1);
    }
  }
  std::string get(const std::string& key, const std::string& fallback) const {
    auto it = values.find(key);
    return it == values.end() ? fallback : it->second;
  }
  std::map<std::string, std::string> values;
};

// The sum of |x| over this rank's shards: changes when the optimizer steps.
double ShardChecksum(strategy::FSDP2Strategy& s) {
  double sum = 0;
  for (const auto& p : s.module().module()->parameters()) {
    if (p.numel() > 0) sum += p.detach().abs().sum().item<double>();
  }
  return sum;
}

// Trains the tests' float64 GPT for the steps [first, end) as the
// arguments say, and writes (rank 0) the reduced losses, what it saw of
// the offload, and the final full state:
//   strategy=full_shard|shard_grad_op|no_shard|hybrid_shard  shard_group=N
//   offload=0|1
//   accumulation=local|sharded  k=micro-batches  clip=max norm (0: none)
//   deferred=0|1 (tensor_init_context)  ac=none|full  frozen=pattern
//   first=N end=N  load=DIR (a checkpoint to start from)  save=DIR
//   tell=0|1 (tell backward the clipping; default 1)
FSDP2_SCENARIO(offload_train) {
  const Args a(args);
  strategy::FSDP2StrategyOptions o = TestStrategyOptions(kSeed, kSamplerSeed);
  o.sharding_strategy = fsdp::ParseShardingStrategy(a.get("strategy", "full_shard"));
  o.cpu_offload = a.get("offload", "0") == "1";
  o.gradient_accumulation = a.get("accumulation", "local") == "sharded"
                                ? strategy::GradientAccumulation::kSharded
                                : strategy::GradientAccumulation::kLocal;
  o.shard_group_size = std::stoi(a.get("shard_group", "0"));
  if (a.get("ac", "none") == "full") o.activation_checkpointing = fsdp::ActivationCheckpointing::Full();
  const std::string frozen = a.get("frozen", "");
  if (!frozen.empty()) o.frozen_params = {frozen};
  const int k = std::stoi(a.get("k", "1"));
  const double clip = std::stod(a.get("clip", "0"));
  const bool tell = a.get("tell", "1") == "1";
  const int first = std::stoi(a.get("first", "0"));
  const int end = std::stoi(a.get("end", std::to_string(kSteps)));
  strategy::FSDP2Strategy s(o);
  s.setup_environment();
  std::shared_ptr<models::GPTModule> module;
  if (a.get("deferred", "0") == "1") {
    auto init = s.tensor_init_context();
    module = TestGPTModule();
  } else {
    module = TestGPTModule();
  }
  s.connect(module);
  s.parallelize();
  const std::string load = a.get("load", "");
  if (!load.empty()) s.load_checkpoint(load);
  auto loader = s.process_dataloader(Dataset(), kGlobalBatch);
  const bool rank0 = s.world()->rank() == 0;
  std::ofstream losses(WorkerOutDir() + "/losses" + std::to_string(s.world()->rank()) + ".txt");
  std::ofstream seen(WorkerOutDir() + "/seen" + std::to_string(s.world()->rank()) + ".txt");
  losses.precision(17);
  for (int step = first; step < end; ++step) {
    const std::vector<Batch> micro = strategy::SplitRows(loader.batch(step), k);
    double loss_sum = 0;
    double before = 0;
    for (int i = 0; i < k; ++i) {
      at::Tensor loss = s.training_step(micro[i], step);
      loss_sum += loss.item<double>();
      const bool last = i == k - 1;
      if (last) before = ShardChecksum(s);
      if (tell) {
        s.backward(loss / k, last, clip);
      } else {
        s.backward(loss / k, last);
      }
    }
    const strategy::StrategyMemoryStats stats = s.memory_stats();  // waits for the host steps
    const bool moved = ShardChecksum(s) != before;
    seen << "moved_in_backward " << moved << " grad_bytes " << stats.sharded_grad_bytes
         << " peak_unsharded " << stats.peak_unsharded_param_bytes << "\n";
    const double norm = s.optimizer_step(clip);
    const strategy::OffloadStats offload = s.offload_stats();
    seen << "norm_parts taken " << offload.norm_parts_taken << " used " << offload.norm_parts_used
         << " units " << offload.units_received << "\n";
    const double loss = s.reduce(at::scalar_tensor(loss_sum / k, at::kDouble)).item<double>();
    losses << step << " " << loss << " " << norm << "\n";
  }
  const std::string save = a.get("save", "");
  if (!save.empty()) s.save_checkpoint(save);
  auto state = s.lightning_module_state_dict(/*rank0_only=*/true);
  if (rank0) {
    std::vector<at::Tensor> values;
    for (auto& [name, t] : state) values.push_back(t);
    torch::save(values, WorkerOutDir() + "/state.pt");
  }
}

struct TrainRun {
  std::vector<double> losses;  // step, loss, norm triples
  std::string seen;            // rank 0's observations
  std::vector<at::Tensor> state;
};

TrainRun Train(int world, std::vector<std::string> args) {
  auto r = LaunchScenario("offload_train", world, args, std::chrono::seconds(240));
  EXPECT_TRUE(r.ok()) << r.Describe();
  TrainRun run;
  run.losses = ReadNumbers(r.out_dir + "/losses0.txt");
  run.seen = ReadFile(r.out_dir + "/seen0.txt");
  if (r.ok()) torch::load(run.state, r.out_dir + "/state.pt");
  return run;
}

// Offload on and off, the same arguments otherwise: bit for bit.
void ExpectOffloadChangesNothing(int world, const std::vector<std::string>& args) {
  std::vector<std::string> on = args, off = args;
  on.push_back("offload=1");
  off.push_back("offload=0");
  const TrainRun with = Train(world, on), without = Train(world, off);
  SCOPED_TRACE("world " + std::to_string(world));
  ASSERT_FALSE(without.losses.empty());
  EXPECT_EQ(with.losses, without.losses);  // exactly: losses and norms
  ASSERT_EQ(with.state.size(), without.state.size());
  for (size_t i = 0; i < with.state.size(); ++i) {
    EXPECT_TRUE(at::equal(with.state[i], without.state[i])) << "parameter " << i;
  }
}

TEST(CpuOffload, EqualsNoOffloadBitForBitOnOneToFourRanks) {
  for (int world = 1; world <= 4; ++world) ExpectOffloadChangesNothing(world, {});
}

TEST(CpuOffload, EqualsNoOffloadUnderEveryShardingStrategy) {
  ExpectOffloadChangesNothing(2, {"strategy=shard_grad_op"});
  ExpectOffloadChangesNothing(3, {"strategy=no_shard"});
  ExpectOffloadChangesNothing(4, {"strategy=hybrid_shard", "shard_group=2"});
}

TEST(CpuOffload, EqualsNoOffloadWithAccumulationAndClipping) {
  ExpectOffloadChangesNothing(2, {"k=2"});
  ExpectOffloadChangesNothing(2, {"k=2", "accumulation=sharded"});
  ExpectOffloadChangesNothing(
      4, {"k=3", "accumulation=sharded", "strategy=hybrid_shard", "shard_group=2"});
  ExpectOffloadChangesNothing(3, {"clip=0.05"});
  ExpectOffloadChangesNothing(1, {"clip=0.05", "k=2"});
  // Not told the clipping: the steps wait for optimizer_step().
  ExpectOffloadChangesNothing(2, {"tell=0"});
}

TEST(CpuOffload, EqualsNoOffloadDeferredCheckpointedAndFrozen) {
  ExpectOffloadChangesNothing(2, {"deferred=1"});
  ExpectOffloadChangesNothing(2, {"ac=full"});
  ExpectOffloadChangesNothing(3, {"frozen=blocks.0.*"});
}

// What offload changes, seen by rank 0 in every step.
TEST(CpuOffload, StepsDuringBackwardOnlyWhenToldThereIsNoClipping) {
  const std::string stepped = "moved_in_backward 1 grad_bytes 0";
  // Told no clipping: each unit stepped as its gradients landed, and their
  // host gradients were freed after its step.
  const TrainRun told = Train(2, {"offload=1"});
  EXPECT_EQ(told.seen.find("moved_in_backward 0"), std::string::npos) << told.seen;
  EXPECT_NE(told.seen.find(stepped), std::string::npos) << told.seen;
  EXPECT_NE(told.seen.find("norm_parts taken 0 used 0"), std::string::npos) << told.seen;
  // Told a norm: the gradients land, the step waits for optimizer_step();
  // each gradient's share of the norm was taken as it landed, and the
  // clipping used every share (none taken again).
  const TrainRun clipped = Train(2, {"offload=1", "clip=0.05"});
  EXPECT_EQ(clipped.seen.find("moved_in_backward 1"), std::string::npos) << clipped.seen;
  EXPECT_EQ(clipped.seen.find("grad_bytes 0 "), std::string::npos) << clipped.seen;
  const std::string last = clipped.seen.substr(clipped.seen.rfind("norm_parts"));
  int64_t taken = -1, used = -1, units = -1;
  ASSERT_EQ(std::sscanf(last.c_str(), "norm_parts taken %" SCNd64 " used %" SCNd64
                        " units %" SCNd64, &taken, &used, &units), 3) << last;
  EXPECT_GT(taken, 0) << last;
  EXPECT_EQ(used, taken) << "every share taken during backward serves the clipping: " << last;
  EXPECT_GT(units, 0) << last;
  // Told a norm but not the backward (tell=0): nothing is taken ahead.
  const TrainRun untold = Train(2, {"offload=1", "clip=0.05", "tell=0"});
  EXPECT_NE(untold.seen.find("norm_parts taken 0 used 0"), std::string::npos) << untold.seen;
  // Without offload the optimizer steps in optimizer_step() only.
  const TrainRun off = Train(2, {"offload=0"});
  EXPECT_EQ(off.seen.find("moved_in_backward 1"), std::string::npos) << off.seen;
}

TEST(CpuOffload, AllGathersIntoABufferOfItsOwnWhereShardsWouldBeAliased) {
  // One rank, the parameters' own dtype: without offload the parameters
  // are the shards (nothing unsharded); with it they are copied.
  const TrainRun off = Train(1, {"offload=0", "end=1"});
  const TrainRun on = Train(1, {"offload=1", "end=1"});
  EXPECT_NE(off.seen.find("peak_unsharded 0\n"), std::string::npos) << off.seen;
  EXPECT_EQ(on.seen.find("peak_unsharded 0\n"), std::string::npos) << on.seen;
}

TEST(CpuOffload, CheckpointsMoveBetweenOffloadAndNot) {
  const std::string dir = ::testing::TempDir();
  const TrainRun straight = Train(2, {"offload=0", "end=4"});
  for (const std::string& saver : {"0", "1"}) {
    const std::string loader = saver == "1" ? "0" : "1";
    const std::string ckpt = dir + "/offload_ckpt_" + saver;
    Train(2, {"offload=" + saver, "end=2", "save=" + ckpt});
    const TrainRun resumed = Train(2, {"offload=" + loader, "first=2", "end=4", "load=" + ckpt});
    SCOPED_TRACE("saved with offload=" + saver);
    ASSERT_EQ(resumed.losses.size(), 6u);
    EXPECT_EQ(resumed.losses,
              std::vector<double>(straight.losses.begin() + 6, straight.losses.end()));
    ASSERT_EQ(resumed.state.size(), straight.state.size());
    for (size_t i = 0; i < resumed.state.size(); ++i) {
      EXPECT_TRUE(at::equal(resumed.state[i], straight.state[i])) << "parameter " << i;
    }
  }
}

// The engine hands each unit's gradients over in backward order: the last
// block first, the root (embeddings, head) last. A sink of the test's
// records the units and applies the gradients.
FSDP2_SCENARIO(offload_order) {
  strategy::FSDP2StrategyOptions o = TestStrategyOptions(kSeed, kSamplerSeed);
  o.cpu_offload = true;
  strategy::FSDP2Strategy s(o);
  s.setup_environment();
  auto module = TestGPTModule();
  s.connect(module);
  s.parallelize();
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& p : module->module()->named_parameters()) {
    names[p.value().unsafeGetTensorImpl()] = p.key();
  }
  std::vector<std::string> order;
  fsdp::set_host_gradient_sink(*module->module(), [&](std::shared_ptr<fsdp::HostGradients> g) {
    const std::string name = names.at(g->shards().front().unsafeGetTensorImpl());
    const size_t block = name.rfind("blocks.", 0) == 0 ? name.find('.', 7) : std::string::npos;
    order.push_back(block == std::string::npos ? "root" : name.substr(0, block));
    g->apply();
  });
  auto loader = s.process_dataloader(Dataset(), kGlobalBatch);
  s.backward(s.training_step(loader.batch(0), 0), true, 0.0);
  if (s.world()->rank() == 0) {
    std::ofstream out(WorkerOutDir() + "/order.txt");
    for (const auto& unit : order) out << unit << "\n";
  }
  // Every trainable parameter got its gradient through the sink.
  for (const auto& p : module->module()->parameters()) {
    if (!p.grad().defined()) throw std::runtime_error("a parameter got no gradient");
  }
}

TEST(CpuOffload, UnitsHandOverTheirGradientsInBackwardOrder) {
  for (int world : {1, 2}) {
    auto r = LaunchScenario("offload_order", world, {}, std::chrono::seconds(120));
    ASSERT_TRUE(r.ok()) << r.Describe();
    EXPECT_EQ(ReadFile(r.out_dir + "/order.txt"), "blocks.1\nblocks.0\nroot\n")
        << "world " << world;
  }
}

// optimizer_step() with a norm after a backward that stepped because it
// was told there was none: refused, naming what to do.
FSDP2_SCENARIO(offload_mismatch) {
  strategy::FSDP2StrategyOptions o = TestStrategyOptions(kSeed, kSamplerSeed);
  o.cpu_offload = true;
  strategy::FSDP2Strategy s(o);
  s.setup_environment();
  s.connect(TestGPTModule());
  s.parallelize();
  auto loader = s.process_dataloader(Dataset(), kGlobalBatch);
  s.backward(s.training_step(loader.batch(0), 0), true, 0.0);
  try {
    s.optimizer_step(1.0);
  } catch (const std::invalid_argument& e) {
    std::ofstream(WorkerOutDir() + "/error.txt") << e.what();
  }
}

TEST(CpuOffload, AStepThatCannotClipAnyMoreIsRefused) {
  auto r = LaunchScenario("offload_mismatch", 1, {}, std::chrono::seconds(60));
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(ReadFile(r.out_dir + "/error.txt").find("pass backward() the max_grad_norm"),
            std::string::npos);
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
