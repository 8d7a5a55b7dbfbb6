// Activation checkpointing (core/fsdp/activation_checkpoint.h) changes what
// is kept between forward and backward, never what is computed:
//  - one process, no FSDP: gradients, losses and the random generator after
//    a step are identical with and without it, dropout included; a module
//    called twice in one forward is recomputed per call; fewer bytes stay
//    alive after forward;
//  - FSDP, every sharding strategy, N = 1..4: training with it equals
//    training without it (float64 losses and parameters within 1e-12
//    relative, float32 within 1e-6), with dropout too, and equals
//    single-process training; every unit all-gathers and reduces exactly as
//    often as without it (the recomputation reuses the pre-backward
//    all-gather); while a unit recomputes, no other unit is unsharded and
//    the engine's pool keeps no idle buffer (issue #14);
//  - FSDP2Strategy: the policy picks the blocks (full, selective) or the
//    only unit, tensor-parallel blocks recompute with their collectives;
//  - bad policies and unsupported nesting are clear errors.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Allocator.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/comm/world.h"
#include "core/common/error.h"
#include "core/fsdp/fully_shard.h"
#include "core/models/gpt.h"
#include "core/strategy/fsdp2_strategy.h"
#include "tests/harness/multi_process.h"
#include "tests/strategy_util.h"
#include "tests/training_util.h"

namespace fsdp2 {
namespace testing {
namespace {

using fsdp::ActivationCheckpointing;

// ------------------------------------------------------- counted CPU bytes

std::atomic<int64_t> g_live{0}, g_peak{0};

// The counted allocations by data pointer (the context is the data pointer
// itself, as raw_allocate() requires).
std::mutex g_mu;
std::unordered_map<void*, std::pair<c10::DataPtr, int64_t>>* g_counted =
    new std::unordered_map<void*, std::pair<c10::DataPtr, int64_t>>();

c10::DeleterFnPtr g_base_raw_deleter = nullptr;

void DeleteCounted(void* data) {
  std::pair<c10::DataPtr, int64_t> entry;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_counted->find(data);
    if (it == g_counted->end()) {  // raw memory from before the installation
      g_base_raw_deleter(data);
      return;
    }
    entry = std::move(it->second);
    g_counted->erase(it);
  }
  g_live -= entry.second;
}  // entry.first frees the memory

// Counts the CPU bytes alive (and their peak) from its installation on.
class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) override {
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t now = g_live.fetch_add(bytes) + bytes;
    int64_t peak = g_peak.load();
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;  // n == 0
    std::lock_guard<std::mutex> lock(g_mu);
    (*g_counted)[data] = {std::move(inner), bytes};
    return {data, data, &DeleteCounted, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &DeleteCounted; }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

void InstallCountingAllocator() {
  static auto* allocator = [] {
    g_base_raw_deleter = c10::GetAllocator(at::kCPU)->raw_deleter();
    auto* a = new CountingAllocator(c10::GetAllocator(at::kCPU));
    c10::SetAllocator(at::kCPU, a, /*priority=*/100);
    return a;
  }();
  (void)allocator;
}

// --------------------------------------------------- one process, no FSDP

models::GPTConfig DeepGPT(double dropout) {
  models::GPTConfig c;
  c.vocab_size = 32;
  c.block_size = 32;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = dropout;
  return c;
}

struct StepResult {
  double loss = 0;
  std::vector<at::Tensor> grads;
  double next_random = 0;  // the generator's next draw after the step
  int64_t live_after_forward = 0, peak = 0;  // CPU bytes, from before forward
};

// One forward/backward of a float64 GPT from seed 5, its blocks
// checkpointed when `checkpoint`.
StepResult GPTStep(double dropout, bool checkpoint, int64_t rows = 4) {
  torch::manual_seed(5);
  models::GPT gpt(DeepGPT(dropout));
  gpt->to(at::kDouble);
  for (size_t i = 0; i < gpt->blocks->size(); ++i) {
    fsdp::checkpoint_module(gpt->block(i), checkpoint);
  }
  auto gen = at::detail::createCPUGenerator(11);
  at::Tensor tokens = at::randint(32, {rows, 33}, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor x = tokens.narrow(1, 0, 32), y = tokens.narrow(1, 1, 32);
  StepResult r;
  const int64_t before = g_live.load();
  g_peak = before;
  at::Tensor loss = models::LanguageModelLoss(fsdp::forward(gpt, x), y);
  r.live_after_forward = g_live.load() - before;
  loss.backward();
  r.peak = g_peak.load() - before;
  r.loss = loss.item<double>();
  for (const auto& p : gpt->parameters()) r.grads.push_back(p.grad().clone());
  r.next_random = at::rand({1}, at::kDouble).item<double>();
  return r;
}

double MaxRelDiff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    at::Tensor scale = at::maximum(at::maximum(a[i].abs(), b[i].abs()),
                                   at::full_like(a[i], 1e-6));
    worst = std::max(worst, ((a[i] - b[i]).abs() / scale).max().item<double>());
  }
  return worst;
}

TEST(OneProcess, RecomputationGivesTheSameGradientsAndRandomState) {
  InstallCountingAllocator();
  for (double dropout : {0.0, 0.2}) {
    const StepResult plain = GPTStep(dropout, false);
    const StepResult ac = GPTStep(dropout, true);
    ASSERT_EQ(plain.grads.size(), ac.grads.size());
    const double grad_diff = MaxRelDiff(ac.grads, plain.grads);
    std::printf("dropout %.1f: loss %.17g vs %.17g, grads max rel diff %.3g; bytes alive "
                "after forward %lld vs %lld, peak %lld vs %lld\n",
                dropout, ac.loss, plain.loss, grad_diff, (long long)ac.live_after_forward,
                (long long)plain.live_after_forward, (long long)ac.peak, (long long)plain.peak);
    EXPECT_NEAR(ac.loss, plain.loss, 1e-12 * plain.loss) << "dropout " << dropout;
    EXPECT_LE(grad_diff, 1e-12) << "dropout " << dropout;
    // The generator continues after backward as it would without
    // recomputation: the next step draws the same masks.
    EXPECT_EQ(ac.next_random, plain.next_random) << "dropout " << dropout;
    // The blocks keep their inputs only: far fewer bytes between forward
    // and backward (4 blocks here; the rest is the embeddings and head).
    EXPECT_LT(ac.live_after_forward, plain.live_after_forward / 2) << "dropout " << dropout;
  }
  // Dropout is on: a different seed would change the loss.
  EXPECT_NE(GPTStep(0.2, false).loss, GPTStep(0.0, false).loss);
}

// A checkpointed module called twice in one forward: each call keeps its
// own input and generator state and is recomputed on its own.
struct TwiceImpl : torch::nn::Module {
  TwiceImpl() {
    inner = register_module("inner", torch::nn::Linear(8, 8));
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = fsdp::forward(inner, x);
    h = fsdp::forward(inner, at::dropout(torch::tanh(h), 0.3, is_training()));
    return head->forward(h);
  }
  torch::nn::Linear inner{nullptr}, head{nullptr};
};
TORCH_MODULE(Twice);

std::pair<double, std::vector<at::Tensor>> TwiceStep(bool checkpoint) {
  torch::manual_seed(9);
  Twice net;
  net->to(at::kDouble);
  fsdp::checkpoint_module(net->inner, checkpoint);
  at::Tensor x = at::randn({5, 8}, at::kDouble);
  at::Tensor loss = fsdp::forward(net, x).pow(2).mean();
  loss.backward();
  std::vector<at::Tensor> grads;
  for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
  return {loss.item<double>(), grads};
}

TEST(OneProcess, ModuleCalledTwiceInOneForward) {
  auto [plain_loss, plain] = TwiceStep(false);
  auto [ac_loss, ac] = TwiceStep(true);
  EXPECT_NEAR(ac_loss, plain_loss, 1e-12 * plain_loss);
  EXPECT_LE(MaxRelDiff(ac, plain), 1e-12);
}

TEST(OneProcess, WithoutGradientsTheModuleJustRuns) {
  torch::manual_seed(3);
  models::GPT gpt(DeepGPT(0));
  at::Tensor tokens = at::randint(32, {2, 8}, at::TensorOptions().dtype(at::kLong));
  at::Tensor plain = fsdp::forward(gpt, tokens).detach();
  for (size_t i = 0; i < gpt->blocks->size(); ++i) fsdp::checkpoint_module(gpt->block(i));
  EXPECT_TRUE(fsdp::is_checkpointed(*gpt->block(0)));
  at::NoGradGuard no_grad;
  at::Tensor out = fsdp::forward(gpt, tokens);
  EXPECT_TRUE(out.equal(plain));
  EXPECT_FALSE(out.requires_grad());
}

// A checkpointed module inside another: recomputed once more inside the
// outer recomputation, with the same result.
TEST(OneProcess, NestedCheckpointedModules) {
  std::vector<std::vector<at::Tensor>> grads;
  for (bool nested : {false, true}) {
    torch::manual_seed(3);
    models::GPT gpt(DeepGPT(0.2));
    gpt->to(at::kDouble);
    fsdp::checkpoint_module(gpt, nested);
    fsdp::checkpoint_module(gpt->block(1), nested);
    at::Tensor tokens = at::randint(32, {2, 8}, at::TensorOptions().dtype(at::kLong));
    fsdp::forward(gpt, tokens).pow(2).mean().backward();
    grads.emplace_back();
    for (const auto& p : gpt->parameters()) grads.back().push_back(p.grad().clone());
  }
  EXPECT_LE(MaxRelDiff(grads[1], grads[0]), 1e-12);
}

TEST(Policy, ParsesAndRefusesBadValues) {
  EXPECT_EQ(ActivationCheckpointing::Parse("none").mode, ActivationCheckpointing::Mode::kNone);
  EXPECT_EQ(ActivationCheckpointing::Parse("FULL").mode, ActivationCheckpointing::Mode::kFull);
  auto s = ActivationCheckpointing::Parse("selective", 3);
  EXPECT_EQ(s.mode, ActivationCheckpointing::Mode::kSelective);
  EXPECT_EQ(s.every, 3);
  EXPECT_EQ(s.ToString(), "selective(every 3)");
  ExpectThrows<InvalidArgumentError>("mode", "expected none, full or selective",
                                     [] { ActivationCheckpointing::Parse("sometimes"); });
  ExpectThrows<InvalidArgumentError>("every", "every >= 1",
                                     [] { ActivationCheckpointing::Parse("selective", 0); });
  torch::nn::Linear plain(2, 2);
  ExpectThrows<InvalidArgumentError>("no units", "no sharded module", [&] {
    fsdp::apply_activation_checkpointing(*plain, ActivationCheckpointing::Full());
  });
  EXPECT_TRUE(fsdp::apply_activation_checkpointing(*plain, ActivationCheckpointing::None())
                  .empty());
}

TEST(OneProcess, ReferenceTrainingIsUnchanged) {
  for (double dropout : {0.0, 0.1}) {
    TrainSpec plain;
    plain.dropout = dropout;
    TrainSpec ac = plain;
    ac.ac = "full";
    const TrainOutput a = TrainReference(ac, 2), b = TrainReference(plain, 2);
    EXPECT_LE(MaxLossRelDiff(a, b, 1e-3), 1e-12) << ac.Name();
    EXPECT_LE(MaxParamRelDiff(a, b, 1e-3), 1e-12) << ac.Name();
  }
}

// ------------------------------------------------------- FSDP, N = 1..4

// args: a TrainSpec with ac set. Trains it without checkpointing, then
// with, in this process; writes rank<r>_plain.txt and rank<r>_ac.txt.
FSDP2_SCENARIO(ac_pair) {
  TrainSpec spec = TrainSpec::FromArgs(args);
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  const std::string prefix = WorkerOutDir() + "/rank" + std::to_string(world->rank());
  TrainSpec plain = spec;
  plain.ac = "none";
  WriteOutput(prefix + "_plain.txt", TrainSharded(plain, world));
  WriteOutput(prefix + "_ac.txt", TrainSharded(spec, world));
}

struct PairBounds {
  double rel;             // AC against no AC: losses and parameters
  bool against_reference;  // also compare with one process (no dropout)
};

void ExpectPairsEqual(const TrainSpec& spec, PairBounds bounds,
                      std::vector<int> worlds = {1, 2, 3, 4}) {
  for (int n : worlds) {
    LaunchResult r = LaunchScenario("ac_pair", n, spec.ToArgs(), std::chrono::seconds(240));
    ASSERT_TRUE(r.ok()) << spec.Name() << " N=" << n << "\n" << r.Describe();
    TrainOutput ref;
    if (bounds.against_reference) ref = TrainReference(spec, n);
    for (int rank = 0; rank < n; ++rank) {
      const std::string prefix = r.out_dir + "/rank" + std::to_string(rank);
      const TrainOutput plain = ReadOutput(prefix + "_plain.txt");
      const TrainOutput ac = ReadOutput(prefix + "_ac.txt");
      const double loss_diff = MaxLossRelDiff(ac, plain, 1e-3);
      const double param_diff = MaxParamRelDiff(ac, plain, 1e-3);
      if (rank == 0) {
        std::printf("%-50s N=%d  AC vs none: loss rel %.3g, param rel %.3g; all-gathers "
                    "per unit (AC) %s\n",
                    spec.Name().c_str(), n, loss_diff, param_diff,
                    c10::str(at::IntArrayRef(ac.all_gathers)).c_str());
      }
      EXPECT_LE(loss_diff, bounds.rel) << spec.Name() << " N=" << n << " rank " << rank;
      EXPECT_LE(param_diff, bounds.rel) << spec.Name() << " N=" << n << " rank " << rank;
      ASSERT_EQ(ac.losses.size(), static_cast<size_t>(spec.steps));
      // The recomputation reuses the pre-backward all-gather: each unit
      // communicates exactly as often as without checkpointing.
      EXPECT_EQ(ac.all_gathers, plain.all_gathers) << spec.Name() << " N=" << n;
      EXPECT_EQ(ac.reductions, plain.reductions) << spec.Name() << " N=" << n;
      if (bounds.against_reference) {
        EXPECT_LE(MaxLossRelDiff(ac, ref, 1e-3), 1e-11) << spec.Name() << " N=" << n;
        EXPECT_LE(MaxParamAbsDiff(ac, ref), 1e-10) << spec.Name() << " N=" << n;
      }
    }
  }
}

class EveryStrategy : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryStrategy, Float64FullCheckpointingChangesNothing) {
  TrainSpec spec;
  spec.strategy = GetParam();
  spec.ac = "full";
  ExpectPairsEqual(spec, {1e-12, true});
}

TEST_P(EveryStrategy, Float64WithDropoutIdenticalToo) {
  TrainSpec spec;
  spec.strategy = GetParam();
  spec.ac = "full";
  spec.dropout = 0.1;
  ExpectPairsEqual(spec, {1e-12, false});
}

INSTANTIATE_TEST_SUITE_P(Strategies, EveryStrategy,
                         ::testing::Values("full_shard", "shard_grad_op", "no_shard",
                                           "hybrid_shard"));

TEST(Fsdp, SelectiveCheckpointingAndOtherModels) {
  TrainSpec spec;
  spec.ac = "selective";
  spec.ac_every = 2;  // the second of the GPT's two blocks
  ExpectPairsEqual(spec, {1e-12, true});
  for (const char* model : {"mlp", "conv", "tied"}) {
    TrainSpec other;
    other.model = model;
    other.ac = "full";
    ExpectPairsEqual(other, {1e-12, true}, {1, 2, 3});
  }
}

// Micro-batches with gradient sync off, and clipping by the global norm.
TEST(Fsdp, AccumulationAndClipping) {
  TrainSpec spec;
  spec.ac = "full";
  spec.grad_accum = 3;
  spec.clip = 0.05;
  spec.steps = 5;
  ExpectPairsEqual(spec, {1e-12, true}, {1, 2, 3});
}

TEST(Fsdp, Float32WithinRounding) {
  TrainSpec spec;
  spec.dtype = "float32";
  spec.ac = "full";
  spec.dropout = 0.1;
  ExpectPairsEqual(spec, {1e-6, false});
}

TEST(Fsdp, Bf16MixedPrecisionIdenticalToo) {
  TrainSpec spec;
  spec.dtype = "float32";
  spec.mixed_precision = "bf16";
  spec.ac = "full";
  ExpectPairsEqual(spec, {1e-6, false}, {1, 2});
}

// A sharded, checkpointed module called twice in one forward, against the
// same without checkpointing. Writes rank<r>.txt: losses, then the
// parameters.
FSDP2_SCENARIO(ac_twice) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  std::ofstream out(WorkerOutDir() + "/rank" + std::to_string(world->rank()) + ".txt");
  out.precision(17);
  for (bool checkpoint : {false, true}) {
    torch::manual_seed(9);
    Twice net;
    net->to(at::kDouble);
    fsdp::fully_shard(net->inner, DataParallelOptions(world));
    fsdp::fully_shard(net, DataParallelOptions(world));
    fsdp::checkpoint_module(net->inner, checkpoint);
    auto opt = strategy::MakeOptimizer(net->parameters(), TestOptimizer("adamw"));
    for (int step = 0; step < 4; ++step) {
      auto gen = at::detail::createCPUGenerator(100 + step * world->size() + world->rank());
      at::Tensor loss = fsdp::forward(net, at::randn({3, 8}, gen, at::kDouble)).pow(2).mean();
      opt->zero_grad(/*set_to_none=*/false);
      loss.backward();
      opt->step();
      out << loss.item<double>() << " ";
    }
    for (const auto& [name, value] : fsdp::full_state_dict(*net)) {
      at::Tensor flat = value.reshape({-1});
      for (int64_t i = 0; i < flat.numel(); ++i) out << flat[i].item<double>() << " ";
    }
    out << "\n";
  }
}

TEST(Fsdp, ShardedModuleCalledTwiceInOneForward) {
  for (int n : {1, 2, 3}) {
    LaunchResult r = LaunchScenario("ac_twice", n, {}, std::chrono::seconds(120));
    ASSERT_TRUE(r.ok()) << r.Describe();
    for (int rank = 0; rank < n; ++rank) {
      std::ifstream in(r.out_dir + "/rank" + std::to_string(rank) + ".txt");
      std::string plain, ac;
      ASSERT_TRUE(std::getline(in, plain) && std::getline(in, ac));
      EXPECT_EQ(ac, plain) << "N=" << n << " rank " << rank;
    }
  }
}

// args: which. Errors that need a sharded module.
FSDP2_SCENARIO(ac_errors) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  torch::manual_seed(1);
  models::GPT gpt(TinyGPT());
  for (size_t i = 0; i < gpt->blocks->size(); ++i) {
    fsdp::fully_shard(gpt->block(i), DataParallelOptions(world));
  }
  fsdp::fully_shard(gpt, DataParallelOptions(world));
  at::Tensor tokens = at::randint(32, {2, 8}, at::TensorOptions().dtype(at::kLong));
  // A unit holding other units is never a candidate of the policy.
  auto names = fsdp::apply_activation_checkpointing(*gpt, ActivationCheckpointing::Full());
  Check(names == std::vector<std::string>{"blocks.0", "blocks.1"},
        "full picks the blocks, got " + c10::Join(",", names));
  // Checkpointing the root by hand: its recomputation would gather the
  // blocks again.
  fsdp::checkpoint_module(gpt);
  ExpectThrows<FailedPreconditionError>("root", "calls the sharded module", [&] {
    fsdp::forward(gpt, tokens);
  });
  fsdp::checkpoint_module(gpt, false);
  // The model is usable again afterwards.
  at::Tensor loss = fsdp::forward(gpt, tokens).sum();
  loss.backward();
}

TEST(Fsdp, ErrorsOnOneAndTwoRanks) {
  for (int n : {1, 2}) {
    LaunchResult r = LaunchScenario("ac_errors", n, {}, std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << r.Describe();
  }
}

// ------------------------------------------ what a checkpointed backward holds

// Units large enough for the engine's buffer pool (1 MiB and more).
struct PoolLayerImpl : torch::nn::Module {
  PoolLayerImpl() { fc = register_module("fc", torch::nn::Linear(512, 512)); }
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc{nullptr};
  // Filled during the recomputation (the forward with gradients enabled):
  // this unit's and the other units' unsharded bytes, the pool's idle bytes;
  // then, when the backward through the recomputed graph begins, the other
  // units' unsharded bytes again.
  int64_t own_unsharded = -1, others_unsharded = -1, pool_kept = -1;
  int64_t lent_at_recompute = -1;  // the pool's lends so far, this one's included
  int64_t others_unsharded_in_backward = -1;
};
TORCH_MODULE(PoolLayer);

struct PoolNetImpl : torch::nn::Module {
  PoolNetImpl() {
    for (int i = 0; i < 3; ++i) {
      layers.push_back(register_module("layer" + std::to_string(i), PoolLayer()));
    }
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& layer : layers) x = fsdp::forward(layer, x);
    return x;
  }
  std::vector<PoolLayer> layers;
};
TORCH_MODULE(PoolNet);

PoolNetImpl* g_pool_net = nullptr;

namespace {
int64_t OthersUnsharded(PoolLayerImpl& self) {
  int64_t bytes = -fsdp::memory_stats(self).unsharded_param_bytes;
  for (auto& layer : g_pool_net->layers) bytes += fsdp::memory_stats(*layer).unsharded_param_bytes;
  return bytes;
}
}  // namespace

at::Tensor PoolLayerImpl::forward(const at::Tensor& x) {
  at::Tensor out = torch::tanh(fc->forward(x));
  if (at::GradMode::is_enabled() && g_pool_net != nullptr) {  // recomputing
    own_unsharded = fsdp::memory_stats(*this).unsharded_param_bytes;
    others_unsharded = OthersUnsharded(*this);
    pool_kept = fsdp::buffer_pool_stats().kept_bytes;
    lent_at_recompute = fsdp::buffer_pool_stats().lent;
    out.register_hook([this](const at::Tensor& grad) {
      others_unsharded_in_backward = OthersUnsharded(*this);
      return grad;
    });
  }
  return out;
}

// args: none. FULL_SHARD, every layer checkpointed: while a unit recomputes,
// the pool keeps no idle buffer (the idle one is lent to the recomputation)
// and no other unit is unsharded, and none is while it computes its
// gradients either (the next unit's prefetch waits for this unit's
// reduction); training still matches training without checkpointing.
FSDP2_SCENARIO(ac_backward_buffers) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  std::vector<double> losses[2];
  for (int ac : {0, 1}) {
    // What training without checkpointing kept (a third buffer: its
    // backward holds a reduction beside a unit and its prefetch) is not
    // the checkpointed run's.
    fsdp::release_buffer_pool();
    torch::manual_seed(3);
    PoolNet net;
    net->to(at::kDouble);
    for (auto& layer : net->layers) fsdp::fully_shard(layer, DataParallelOptions(world));
    fsdp::fully_shard(net, DataParallelOptions(world));
    if (ac) fsdp::apply_activation_checkpointing(*net, ActivationCheckpointing::Full());
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    auto gen = at::detail::createCPUGenerator(20 + world->rank());
    for (int step = 0; step < 3; ++step) {
      at::Tensor x = at::randn({4, 512}, gen, at::kDouble);
      const int64_t lent_at_step_start = fsdp::buffer_pool_stats().lent;
      sgd.zero_grad(/*set_to_none=*/false);
      at::Tensor loss = fsdp::forward(net, x).pow(2).mean();
      g_pool_net = net.get();
      loss.backward();
      g_pool_net = nullptr;
      sgd.step();
      losses[ac].push_back(loss.item<double>());
      if (!ac || step == 0) continue;  // the pool is warm from step 1 on
      for (size_t i = 0; i < net->layers.size(); ++i) {
        const auto& layer = *net->layers[i];
        const std::string which = "step " + std::to_string(step) + " layer " + std::to_string(i);
        Check(layer.own_unsharded > 0, which + " is unsharded while it recomputes");
        Check(layer.others_unsharded == 0,
              which + ": another unit is unsharded while it recomputes (" +
                  std::to_string(layer.others_unsharded) + " bytes)");
        Check(layer.others_unsharded_in_backward == 0,
              which + ": another unit is unsharded while it computes its gradients (" +
                  std::to_string(layer.others_unsharded_in_backward) + " bytes)");
        // The reduction of the unit before has finished, and the idle
        // buffer is lent to this unit's recomputation (RecomputeArena).
        Check(layer.pool_kept == 0, which + ": the pool keeps " +
                                        std::to_string(layer.pool_kept) +
                                        " idle bytes while it recomputes");
        // Each recomputation borrowed a buffer of its own (backward runs
        // the layers last to first).
        const int64_t lent_before =
            i + 1 == net->layers.size() ? lent_at_step_start : net->layers[i + 1]->lent_at_recompute;
        Check(layer.lent_at_recompute > lent_before,
              which + ": no pool buffer was lent to its recomputation");
      }
    }
  }
  for (size_t k = 0; k < losses[0].size(); ++k) {
    Check(std::abs(losses[1][k] - losses[0][k]) <= 1e-12 * std::abs(losses[0][k]),
          "step " + std::to_string(k) + " loss differs with checkpointing");
  }
}

TEST(Fsdp, CheckpointedBackwardHoldsOneUnitAndNoIdleBuffers) {
  LaunchResult r = LaunchScenario("ac_backward_buffers", 2, {}, std::chrono::seconds(120));
  EXPECT_TRUE(r.ok()) << r.Describe();
}

// ---------------------------------------------------- through FSDP2Strategy

// A model sharded as one unit (no ModuleList), like a TorchScript model.
struct OneUnitImpl : torch::nn::Module {
  OneUnitImpl() {
    a = register_module("a", torch::nn::Linear(6, 12));
    b = register_module("b", torch::nn::Linear(12, 2));
  }
  at::Tensor forward(const at::Tensor& x) {
    return b->forward(at::dropout(torch::tanh(a->forward(x)), 0.2, is_training()));
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(OneUnit);

class OneUnitModule : public strategy::TrainingModule {
 public:
  OneUnitModule() { net_->to(at::kDouble); }
  std::shared_ptr<torch::nn::Module> module() override { return net_.ptr(); }
  at::Tensor training_step(const strategy::Batch& batch, int64_t) override {
    return (fsdp::forward(net_, batch[0]) - batch[1]).pow(2).mean();
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() override {
    return strategy::MakeOptimizer(net_->parameters(), TestOptimizer("adamw"));
  }

 private:
  OneUnit net_;
};

// args: model (gpt | one_unit), dp, tp, ac mode, ac every, dropout. Writes
// rank<r>.txt: the checkpointed modules, then each step's loss and norm.
FSDP2_SCENARIO(ac_strategy) {
  auto o = TestStrategyOptions(/*seed=*/4);
  o.data_parallel_size = strategy::ParallelSize::Parse(args.at(1));
  o.tensor_parallel_size = strategy::ParallelSize::Parse(args.at(2));
  o.activation_checkpointing = ActivationCheckpointing::Parse(args.at(3), std::stoi(args.at(4)));
  strategy::FSDP2Strategy s(o);
  s.setup_environment();
  std::shared_ptr<strategy::TrainingModule> module;
  strategy::Batch data;
  if (args.at(0) == "gpt") {
    models::GPTConfig c = TinyGPT();
    c.n_layer = 3;
    c.dropout = std::stod(args.at(5));
    module = TestGPTModule(c);
    data = TokenWindows(c.vocab_size, 16);
  } else {
    module = std::make_shared<OneUnitModule>();
    auto gen = at::detail::createCPUGenerator(2);
    data = {at::randn({16, 6}, gen, at::kDouble), at::randn({16, 2}, gen, at::kDouble)};
  }
  s.connect(module);
  s.parallelize();
  std::ofstream out(WorkerOutDir() + "/rank" + std::to_string(s.world()->rank()) + ".txt");
  out.precision(17);
  out << "modules " << s.checkpointed_modules().size() << ":"
      << c10::Join(",", s.checkpointed_modules()) << "|\n";
  auto loader = s.process_dataloader(data, 8);
  for (int i = 0; i < 4; ++i) {
    at::Tensor loss = s.training_step(loader.batch(i % loader.num_batches()), i);
    s.backward(loss);
    const double norm = s.optimizer_step(/*clip=*/1.0);
    out << s.reduce(loss).item<double>() << " " << norm << "\n";
  }
}

std::vector<std::string> StrategyRun(int world, const std::vector<std::string>& args) {
  LaunchResult r = LaunchScenario("ac_strategy", world, args, std::chrono::seconds(240));
  EXPECT_TRUE(r.ok()) << r.Describe();
  std::vector<std::string> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.push_back(ReadFile(r.out_dir + "/rank" + std::to_string(rank) + ".txt"));
  }
  return ranks;
}

std::string Body(const std::string& file) { return file.substr(file.find("|\n") + 2); }

TEST(Strategy, PolicyPicksBlocksAndTensorParallelBlocksRecompute) {
  struct Case {
    int world;
    std::string dp, tp, mode, every, want;
  };
  for (const Case& c : std::vector<Case>{
           {2, "2", "1", "full", "1", "modules 3:blocks.0,blocks.1,blocks.2|"},
           {2, "2", "1", "selective", "2", "modules 1:blocks.1|"},
           {2, "1", "2", "full", "1", "modules 3:blocks.0,blocks.1,blocks.2|"},
           {4, "2", "2", "selective", "3", "modules 1:blocks.2|"}}) {
    for (const char* dropout : {"0", "0.1"}) {
      const std::string name = "dp " + c.dp + " tp " + c.tp + " " + c.mode + " every " +
                               c.every + " dropout " + dropout;
      auto plain = StrategyRun(c.world, {"gpt", c.dp, c.tp, "none", "1", dropout});
      auto ac = StrategyRun(c.world, {"gpt", c.dp, c.tp, c.mode, c.every, dropout});
      ASSERT_EQ(ac.size(), plain.size());
      for (size_t rank = 0; rank < ac.size(); ++rank) {
        EXPECT_EQ(ac[rank].substr(0, ac[rank].find("|") + 1), c.want) << name;
        EXPECT_EQ(plain[rank].substr(0, plain[rank].find("|") + 1), "modules 0:|") << name;
        // Losses and clipped norms to 17 digits.
        EXPECT_EQ(Body(ac[rank]), Body(plain[rank])) << name << " rank " << rank;
      }
      std::printf("%s: checkpointed %s; 4 steps identical\n", name.c_str(),
                  c.want.c_str());
    }
  }
}

TEST(Strategy, ModelOfOneUnitIsCheckpointedWhole) {
  for (int world : {1, 2}) {
    auto plain = StrategyRun(world, {"one_unit", "auto", "1", "none", "1", "0"});
    auto ac = StrategyRun(world, {"one_unit", "auto", "1", "full", "1", "0"});
    for (size_t rank = 0; rank < ac.size(); ++rank) {
      EXPECT_EQ(ac[rank].substr(0, ac[rank].find("|") + 1), "modules 1:|");  // the root
      EXPECT_EQ(Body(ac[rank]), Body(plain[rank])) << "rank " << rank;
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
