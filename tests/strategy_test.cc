// FSDP2Strategy end to end on 1-4 ranks: training through the strategy equals
// single-process training, a run resumed in new processes through
// load_model_state_dict + the deferred load_optimizer_state_dict continues
// with the same losses, and the strategy's contract and errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/checkpoint/background_saver.h"
#include "core/checkpoint/full_checkpoint.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/fsdp/fully_shard.h"
#include "core/launch/local_launcher.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/trainer.h"
#include "tests/harness/multi_process.h"
#include "tests/strategy_util.h"

namespace fsdp2 {
namespace testing {
namespace {

using strategy::Batch;

constexpr uint64_t kSeed = 11;
constexpr uint64_t kSamplerSeed = 5;
constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks
constexpr int64_t kRows = 96;

Batch Dataset(int64_t rows) { return TokenWindows(TinyGPT().vocab_size, rows); }

// Counts how often the strategy applies it; the loss is the module's.
struct CountingReduction : strategy::LossReduction {
  int calls = 0;
  at::Tensor forward(const Batch&, const at::Tensor& output) override {
    ++calls;
    return output;
  }
};

// The tests' GPT module, counting the training steps its loss reduction
// sees.
class CountingGPTModule : public models::GPTModule {
 public:
  CountingGPTModule() : models::GPTModule(TinyGPT(), TestOptimizer("adamw"), at::kDouble) {}
  std::shared_ptr<strategy::LossReduction> loss_reduction(
      strategy::StepType step) override {
    return step == strategy::StepType::kTraining ? reduction : nullptr;
  }
  std::shared_ptr<CountingReduction> reduction = std::make_shared<CountingReduction>();
};

strategy::FSDP2StrategyOptions Options() { return TestStrategyOptions(kSeed, kSamplerSeed); }

// One process, no FSDP: the model (seeded as the strategy seeds), its
// optimizer, the data and the global batches every reference below uses.
struct Reference {
  Reference() {
    torch::manual_seed(kSeed);
    module = TestGPTModule();
    optimizer = module->configure_optimizers();
  }
  static strategy::DistributedSamplerOptions SamplerOptions() {
    strategy::DistributedSamplerOptions o;
    o.seed = kSamplerSeed;
    o.global_batch_size = kGlobalBatch;
    return o;
  }
  Batch rows(const std::vector<int64_t>& idx) const { return SelectRows(data, idx); }
  std::shared_ptr<models::GPTModule> module;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  Batch data = Dataset(kRows);
  strategy::DistributedSampler sampler{kRows, 0, 1, SamplerOptions()};
};

// The reference losses of `steps` plain steps on the same global batches.
std::vector<double> ReferenceLosses(int steps) {
  torch::manual_seed(kSeed);
  auto module = TestGPTModule();
  const strategy::DistributedSampler sampler{kRows, 0, 1, Reference::SamplerOptions()};
  return TrainOneProcess(*module, Dataset(kRows), sampler, steps).losses;
}

// Joins the job, connects a fresh CountingGPTModule (seeded alike on every
// rank) and parallelizes it.
std::shared_ptr<CountingGPTModule> Prepare(strategy::FSDP2Strategy& s) {
  s.setup_environment();
  auto module = std::make_shared<CountingGPTModule>();
  s.connect(module);
  s.parallelize();
  return module;
}

// One optimizer step on global batch 0, so the optimizer has state.
void TrainOneStep(strategy::FSDP2Strategy& s) {
  auto loader = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  s.backward(s.training_step(loader.batch(0), 0));
  s.optimizer_step();
}

// args: first_step end_step [state_in_dir] [state_out_dir]
FSDP2_SCENARIO(strategy_train) {
  const int first = std::stoi(args.at(0)), end = std::stoi(args.at(1));
  const std::string state_in = args.size() > 2 ? args[2] : "-";
  const std::string state_out = args.size() > 3 ? args[3] : "-";
  strategy::FSDP2Strategy s(Options());
  auto module = Prepare(s);
  s.parallelize();  // warns, does nothing
  const int rank = s.world()->rank();
  if (state_in != "-") {
    std::vector<at::Tensor> values;
    torch::load(values, state_in + "/model.pt");
    std::vector<std::pair<std::string, at::Tensor>> state;
    auto names = module->module()->named_parameters().keys();
    for (size_t i = 0; i < names.size(); ++i) state.emplace_back(names[i], values.at(i));
    s.load_model_state_dict(state);
    std::ifstream in(state_in + "/optim" + std::to_string(rank) + ".bin", std::ios::binary);
    s.load_optimizer_state_dict(std::string(std::istreambuf_iterator<char>(in), {}));
    if (!s.has_pending_optimizer_state()) throw std::runtime_error("state not kept");
  }
  auto loader = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  std::ofstream out(WorkerOutDir() + "/losses" + std::to_string(rank) + ".txt");
  out.precision(17);
  for (int i = first; i < end; ++i) {
    at::Tensor loss = s.training_step(loader.batch(i), i);
    if (s.has_pending_optimizer_state()) throw std::runtime_error("state not applied");
    s.backward(loss);
    s.optimizer_step();
    out << s.reduce(loss).item<double>() << "\n";
  }
  if (module->reduction->calls != end - first) {
    throw std::runtime_error("training loss reduction was not applied once per step");
  }
  if (s.current_epoch_step().step != end - first) throw std::runtime_error("step count");
  // Validation on global batch 0: the mean over data-parallel ranks.
  auto val = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  std::ofstream(WorkerOutDir() + "/val" + std::to_string(rank) + ".txt")
      << std::setprecision(17) << s.validation_step(val.batch(0), 0).item<double>();
  at::Tensor pred = s.predict_step(val.batch(0), 0);
  if (pred.size(0) != kGlobalBatch / s.data_parallel_size()) {
    throw std::runtime_error("predict_step must return this rank's rows");
  }
  if (state_out != "-") {
    auto full = s.lightning_module_state_dict(/*rank0_only=*/true);
    if (rank == 0) {
      std::vector<at::Tensor> values;
      for (auto& kv : full) values.push_back(kv.second);
      torch::save(values, state_out + "/model.pt");
    } else if (!full.empty()) {
      throw std::runtime_error("rank0_only state dict on rank " + std::to_string(rank));
    }
    std::ofstream opt(state_out + "/optim" + std::to_string(rank) + ".bin", std::ios::binary);
    opt << s.optimizer_state_dict();
  }
  s.barrier();
  s.teardown();
}

LaunchResult Launch(int n, std::vector<std::string> args) {
  return LaunchScenario("strategy_train", n, std::move(args));
}

TEST(FSDP2Strategy, TrainsLikeOneProcessAndValidatesOverAllRanks) {
  const int steps = 6;
  const auto ref = ReferenceLosses(steps);
  // Reference validation loss: the model after `steps` steps on batch 0.
  for (int n : {1, 2, 3, 4}) {
    auto r = Launch(n, {"0", std::to_string(steps)});
    ASSERT_TRUE(r.ok()) << r.Describe();
    for (int rank = 0; rank < n; ++rank) {
      auto losses = ReadNumbers(r.out_dir + "/losses" + std::to_string(rank) + ".txt");
      ASSERT_EQ(losses.size(), ref.size());
      for (int i = 0; i < steps; ++i) {
        EXPECT_NEAR(losses[i], ref[i], 1e-11 * ref[i]) << "N=" << n << " step " << i;
      }
      auto val = ReadNumbers(r.out_dir + "/val" + std::to_string(rank) + ".txt");
      auto val0 = ReadNumbers(r.out_dir + "/val0.txt");
      ASSERT_EQ(val.size(), 1u);
      EXPECT_EQ(val[0], val0[0]) << "validation loss differs between ranks";
    }
    std::printf("N=%d: %d strategy steps equal single-process training\n", n, steps);
  }
}

// fully_shard's controls by name: ignored parameters (a name and a glob)
// whose gradients backward() all-reduces (or not), and explicit prefetch
// lists (the root's, forward and backward, and a block's empty one).
// Writes each step's loss (the mean over ranks). args: steps all_reduce
FSDP2_SCENARIO(strategy_controls) {
  const int steps = std::stoi(args.at(0));
  auto o = Options();
  o.ignored_params = {"wpe.weight", "blocks.1.fc.*"};
  o.ignored_params_all_reduce = args.at(1) == "1";
  o.forward_prefetch_modules = {{"", {"blocks.1", "blocks.0"}}, {"blocks.0", {}}};
  o.backward_prefetch_modules = {{"", {"blocks.0", "blocks.1"}}};
  strategy::FSDP2Strategy s(o);
  auto module = Prepare(s);
  const auto params = module->module()->named_parameters();
  if (params["wpe.weight"].size(0) != TinyGPT().block_size ||
      params["blocks.1.fc.bias"].size(0) != 4 * TinyGPT().n_embd) {
    throw std::runtime_error("ignored parameters must stay whole on every rank");
  }
  auto loader = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  std::ofstream out(WorkerOutDir() + "/losses" + std::to_string(s.world()->rank()) + ".txt");
  out.precision(17);
  for (int i = 0; i < steps; ++i) {
    at::Tensor loss = s.training_step(loader.batch(i), i);
    s.backward(loss);
    s.optimizer_step();
    out << s.reduce(loss).item<double>() << "\n";
  }
  s.teardown();
}

TEST(FSDP2Strategy, ControlsByNameTrainLikeOneProcess) {
  const int steps = 5;
  const auto ref = ReferenceLosses(steps);
  for (int n : {1, 2, 3, 4}) {
    auto r = LaunchScenario("strategy_controls", n, {std::to_string(steps), "1"});
    ASSERT_TRUE(r.ok()) << r.Describe();
    for (int rank = 0; rank < n; ++rank) {
      auto losses = ReadNumbers(r.out_dir + "/losses" + std::to_string(rank) + ".txt");
      ASSERT_EQ(losses.size(), ref.size());
      for (int i = 0; i < steps; ++i) {
        EXPECT_NEAR(losses[i], ref[i], 1e-11 * ref[i]) << "N=" << n << " step " << i;
      }
    }
  }
  // Without the all-reduce each rank steps its ignored parameters with its
  // own rows' gradient: the ranks drift apart, and from one process.
  auto r = LaunchScenario("strategy_controls", 2, {std::to_string(steps), "0"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  auto losses = ReadNumbers(r.out_dir + "/losses0.txt");
  ASSERT_EQ(losses.size(), ref.size());
  EXPECT_GT(std::abs(losses.back() - ref.back()), 1e-9 * ref.back())
      << "the ignored parameters' gradients were reduced although nobody asked";
}

// What the strategy's fully_shard controls change. args: controls, a
// comma-separated list of fp=D / bp=D (prefetch depths), raf=V
// (set_reshard_after_forward(V)), sgo (SHARD_GRAD_OP), fl / bl (the root's
// forward / backward prefetch list: both blocks), or "-". Three steps;
// writes memory<rank>.txt: the peak of unsharded parameter bytes, the
// unsharded bytes right after the first training_step() (its forward), and
// the all-gathers of blocks.0, blocks.1 and the root.
FSDP2_SCENARIO(strategy_controls_memory) {
  auto o = Options();
  std::stringstream controls(args.at(0));
  for (std::string c; std::getline(controls, c, ',');) {
    if (c.rfind("fp=", 0) == 0) {
      o.forward_prefetch = std::stoi(c.substr(3));
    } else if (c.rfind("bp=", 0) == 0) {
      o.backward_prefetch = std::stoi(c.substr(3));
    } else if (c.rfind("raf=", 0) == 0) {
      o.set_reshard_after_forward(std::stoi(c.substr(4)));
    } else if (c == "sgo") {
      o.sharding_strategy = fsdp::ShardingStrategy::kShardGradOp;
    } else if (c == "fl") {
      o.forward_prefetch_modules = {{"", {"blocks.1", "blocks.0"}}};
    } else if (c == "bl") {
      o.backward_prefetch_modules = {{"", {"blocks.0", "blocks.1"}}};
    } else if (c != "-") {
      throw std::invalid_argument("unknown control " + c);
    }
  }
  strategy::FSDP2Strategy s(o);
  auto module = Prepare(s);
  auto loader = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  int64_t after_forward = -1;
  for (int i = 0; i < 3; ++i) {
    at::Tensor loss = s.training_step(loader.batch(i), i);
    if (i == 0) after_forward = s.memory_stats().unsharded_param_bytes;
    s.backward(loss);
    s.optimizer_step();
  }
  std::ofstream out(WorkerOutDir() + "/memory" + std::to_string(s.world()->rank()) + ".txt");
  out << s.memory_stats().peak_unsharded_param_bytes << " " << after_forward;
  auto units = module->module()->named_modules();
  for (const char* unit : {"blocks.0", "blocks.1", ""}) {
    out << " " << fsdp::comm_wait_stats(*units[unit]).all_gathers;
  }
  out << "\n";
  s.teardown();
}

// {peak, after forward, gathers of blocks.0, blocks.1, root} of `controls`
// on `n` ranks; the same on every rank.
std::vector<int64_t> ControlsMemory(int n, const std::string& controls) {
  auto r = LaunchScenario("strategy_controls_memory", n, {controls});
  EXPECT_TRUE(r.ok()) << controls << "\n" << r.Describe();
  if (!r.ok()) return std::vector<int64_t>(5, -1);
  std::vector<int64_t> values;
  std::istringstream in(ReadFile(r.out_dir + "/memory0.txt"));
  for (int64_t v; in >> v;) values.push_back(v);
  EXPECT_EQ(values.size(), 5u) << controls;
  values.resize(5, -1);
  for (int rank = 1; rank < n; ++rank) {
    EXPECT_EQ(ReadFile(r.out_dir + "/memory" + std::to_string(rank) + ".txt"),
              ReadFile(r.out_dir + "/memory0.txt"))
        << controls << ", rank " << rank;
  }
  std::printf("%-14s N=%d: peak unsharded %lld B, after forward %lld B, all-gathers %lld %lld "
              "%lld\n", controls.c_str(), n, static_cast<long long>(values[0]),
              static_cast<long long>(values[1]), static_cast<long long>(values[2]),
              static_cast<long long>(values[3]), static_cast<long long>(values[4]));
  return values;
}

// The strategy's controls reach fully_shard: prefetch depths and lists
// raise the unsharded peak over no prefetch; resharding after forward
// leaves the root (FULL_SHARD), everything (SHARD_GRAD_OP, or 0) or half of
// every unit (down to pairs of 4 ranks) unsharded; SHARD_GRAD_OP gathers
// each unit once per step, FULL_SHARD the blocks twice.
TEST(FSDP2Strategy, FullyShardControlsChangeWhatIsUnshardedWhen) {
  const auto none = ControlsMemory(2, "fp=0,bp=0");
  for (const char* raised : {"fp=2,bp=0", "fp=0,bp=2", "fp=0,bp=0,fl", "fp=0,bp=0,bl"}) {
    EXPECT_GT(ControlsMemory(2, raised)[0], none[0]) << raised << " against no prefetch";
  }
  for (int n : {2, 4}) {
    const auto full = ControlsMemory(n, "-");
    const auto sgo = ControlsMemory(n, "sgo");
    const auto kept = ControlsMemory(n, "raf=0");
    const int64_t root = full[1], blocks = sgo[1] - full[1];
    EXPECT_GT(root, 0) << "N=" << n << ": the root stays unsharded after forward";
    EXPECT_GT(blocks, 0) << "N=" << n << ": SHARD_GRAD_OP keeps the blocks after forward";
    EXPECT_EQ(kept[1], sgo[1]) << "N=" << n << ": reshard_after_forward 0 keeps everything";
    EXPECT_EQ(full[2], 6) << "N=" << n;
    EXPECT_EQ(full[3], 6) << "N=" << n;
    EXPECT_EQ(full[4], 3) << "N=" << n;
    for (int u = 2; u < 5; ++u) EXPECT_EQ(sgo[u], 3) << "N=" << n << ", SHARD_GRAD_OP unit " << u;
    if (n == 4) {  // set explicitly, the size applies to the root too
      const auto half = ControlsMemory(n, "raf=2");
      EXPECT_EQ(half[1], sgo[1] / 2) << "reshard after forward down to pairs: half of each unit";
      for (int u = 2; u < 5; ++u) EXPECT_EQ(half[u], 6) << "raf=2, unit " << u;
    }
  }
}

// Ignored parameters inside blocks (a Linear's bias, an attention weight)
// under the default bf16 policy: each is cast to bf16 with its block for
// forward and backward, and stays float64 -- its value, its gradient, its
// optimizer step -- on every rank. Writes each step's loss, then the
// ignored parameters' values. args: steps
FSDP2_SCENARIO(strategy_ignored_bf16) {
  const int steps = std::stoi(args.at(0));
  auto o = Options();
  o.mp_policy = strategy::DefaultMixedPrecision();
  o.ignored_params = {"blocks.1.fc.bias", "blocks.0.attn.qkv.weight"};
  o.ignored_params_all_reduce = true;
  strategy::FSDP2Strategy s(o);
  auto module = Prepare(s);
  const auto params = module->module()->named_parameters();
  const std::vector<at::Tensor> ignored = {params["blocks.1.fc.bias"],
                                           params["blocks.0.attn.qkv.weight"]};
  std::vector<at::Tensor> initial;
  for (const at::Tensor& p : ignored) initial.push_back(p.detach().clone());
  auto loader = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  const int rank = s.world()->rank();
  std::ofstream out(WorkerOutDir() + "/ignored" + std::to_string(rank) + ".txt");
  out.precision(17);
  for (int i = 0; i < steps; ++i) {
    at::Tensor loss = s.training_step(loader.batch(i), i);
    s.backward(loss);
    for (const at::Tensor& p : ignored) {
      Check(p.scalar_type() == at::kDouble && p.grad().defined() &&
                p.grad().scalar_type() == at::kDouble,
            "an ignored parameter and its gradient stay float64 after backward");
    }
    s.optimizer_step();
    out << s.reduce(loss).item<double>() << "\n";
  }
  for (size_t k = 0; k < ignored.size(); ++k) {
    Check(ignored[k].sizes() == initial[k].sizes(), "ignored parameters stay whole");
    Check(!at::equal(ignored[k], initial[k]), "an ignored parameter was not trained");
    const at::Tensor flat = ignored[k].detach().flatten().contiguous();
    for (int64_t j = 0; j < flat.numel(); ++j) out << flat[j].item<double>() << "\n";
  }
  s.teardown();
}

TEST(FSDP2Strategy, IgnoredParametersInsideBlocksTrainUnderBf16) {
  const int steps = 4;
  const auto ref = ReferenceLosses(steps);  // one process, float64, no FSDP
  std::vector<double> one_rank;
  for (int n : {1, 2, 4}) {
    auto r = LaunchScenario("strategy_ignored_bf16", n, {std::to_string(steps)});
    ASSERT_TRUE(r.ok()) << r.Describe();
    const auto rank0 = ReadNumbers(r.out_dir + "/ignored0.txt");
    ASSERT_GT(rank0.size(), static_cast<size_t>(steps));
    for (int rank = 0; rank < n; ++rank) {
      const auto values = ReadNumbers(r.out_dir + "/ignored" + std::to_string(rank) + ".txt");
      // The losses are the mean over ranks; the ignored parameters, whose
      // gradients backward all-reduces, are the same bits on every rank.
      EXPECT_EQ(values, rank0) << "N=" << n << " rank " << rank;
    }
    // bf16 compute tracks the one-process float64 run as the bf16
    // equivalence test bounds it (2%), and the N-rank runs the one-rank run.
    for (int i = 0; i < steps; ++i) {
      EXPECT_NEAR(rank0[i], ref[i], 2e-2 * ref[i]) << "N=" << n << " step " << i;
    }
    if (n == 1) one_rank = rank0;
    for (size_t i = 0; i < rank0.size() && i < one_rank.size(); ++i) {
      EXPECT_NEAR(rank0[i], one_rank[i], 2e-2 * std::max(1.0, std::abs(one_rank[i])))
          << "N=" << n << " value " << i << " against one rank";
    }
    std::printf("N=%d: ignored parameters inside blocks train under bf16; last loss %.6f "
                "(one process in float64: %.6f)\n",
                n, rank0[steps - 1], ref[steps - 1]);
  }
}

TEST(FSDP2Strategy, RejectsAGlobalBatchThatRanksCannotSplit) {
  auto r = Launch(5, {"0", "1"});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.ranks[0].log.find("multiple of the data-parallel size"), std::string::npos)
      << r.Describe();
}

TEST(FSDP2Strategy, ResumeWithDeferredOptimizerStateContinuesTheSameRun) {
  const int steps = 6;
  const auto ref = ReferenceLosses(steps);
  for (int n : {1, 2, 4}) {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/resume" +
                            std::to_string(n);
    ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
    auto first = Launch(n, {"0", "3", "-", dir});
    ASSERT_TRUE(first.ok()) << first.Describe();
    auto second = Launch(n, {"3", std::to_string(steps), dir, "-"});
    ASSERT_TRUE(second.ok()) << second.Describe();
    auto a = ReadNumbers(first.out_dir + "/losses0.txt");
    auto b = ReadNumbers(second.out_dir + "/losses0.txt");
    a.insert(a.end(), b.begin(), b.end());
    ASSERT_EQ(a.size(), ref.size());
    for (int i = 0; i < steps; ++i) {
      EXPECT_NEAR(a[i], ref[i], 1e-11 * ref[i]) << "N=" << n << " step " << i;
    }
  }
}

// Trainer.fit with 2 accumulated batches per step, clipping and validation
// every 2 steps; rank 0's metrics go to the out dir.
FSDP2_SCENARIO(trainer_fit) {
  strategy::FSDP2Strategy s(Options());
  auto module = Prepare(s);
  auto train = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  auto val = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  strategy::TrainerOptions o;
  o.max_steps = 4;
  o.accumulate_grad_batches = 2;
  o.gradient_clip_val = 0.5;
  o.val_check_interval = 2;
  o.limit_val_batches = 1;
  o.progress_bar = 0;
  o.tokens_per_row = 8;
  o.metrics_jsonl = WorkerOutDir() + "/metrics.jsonl";
  o.metrics_csv = WorkerOutDir() + "/metrics.csv";
  o.loss_curve_svg = WorkerOutDir() + "/loss.svg";
  o.checkpoint_every_n_steps = 3;
  std::vector<int64_t> checkpoints;
  o.on_checkpoint = [&](strategy::FSDP2Strategy&, int64_t step) { checkpoints.push_back(step); };
  strategy::Trainer trainer(s, o);
  const auto& history = trainer.fit(train, &val);
  if (checkpoints != std::vector<int64_t>{3, 4}) throw std::runtime_error("checkpoint steps");
  std::ofstream out(WorkerOutDir() + "/fit" + std::to_string(s.world()->rank()) + ".txt");
  out.precision(17);
  for (const auto& m : history) out << m.loss << " " << m.grad_norm << " " << m.val_loss << "\n";
  s.barrier();
}

TEST(Trainer, FitEqualsOneProcessWithAccumulationClippingAndValidation) {
  // Reference: step k trains on loader batches 2k and 2k+1 as one batch of
  // 2 x 12 rows (equal halves, so the mean matches the accumulated mean),
  // clips to 0.5, and validates on batch 0 after steps 2 and 4.
  Reference single;
  std::vector<std::array<double, 3>> ref;
  for (int step = 0; step < 4; ++step) {
    auto idx = single.sampler.global_batch(2 * step);
    auto more = single.sampler.global_batch(2 * step + 1);
    idx.insert(idx.end(), more.begin(), more.end());
    at::Tensor loss = single.module->loss(single.rows(idx));
    loss.backward();
    const double norm =
        torch::nn::utils::clip_grad_norm_(single.module->module()->parameters(), 0.5);
    single.optimizer->step();
    single.optimizer->zero_grad(/*set_to_none=*/false);
    double val = -1;
    if ((step + 1) % 2 == 0) {
      at::NoGradGuard no_grad;
      val = single.module->loss(single.rows(single.sampler.global_batch(0))).item<double>();
    }
    ref.push_back({loss.item<double>(), norm, val});
  }
  for (int n : {1, 2, 3, 4}) {
    auto r = LaunchScenario("trainer_fit", n);
    ASSERT_TRUE(r.ok()) << r.Describe();
    auto got = ReadNumbers(r.out_dir + "/fit0.txt");
    ASSERT_EQ(got.size(), 12u);
    for (int step = 0; step < 4; ++step) {
      for (int k = 0; k < 3; ++k) {
        EXPECT_NEAR(got[3 * step + k], ref[step][k], 1e-10 * std::abs(ref[step][k]))
            << "N=" << n << " step " << step << " field " << k;
      }
    }
    std::ifstream csv(r.out_dir + "/metrics.csv");
    std::string line;
    int lines = 0;
    while (std::getline(csv, line)) ++lines;
    EXPECT_EQ(lines, 5) << "header + one line per step";
    std::ifstream jsonl(r.out_dir + "/metrics.jsonl");
    std::getline(jsonl, line);
    EXPECT_NE(line.find("\"tokens_per_s\""), std::string::npos) << line;
    EXPECT_EQ(line.find("val_loss"), std::string::npos) << "no validation at step 1";
    std::getline(jsonl, line);
    EXPECT_NE(line.find("\"val_loss\""), std::string::npos) << line;
    std::ifstream svg(r.out_dir + "/loss.svg");
    std::string picture((std::istreambuf_iterator<char>(svg)), {});
    EXPECT_EQ(picture.rfind("<svg", 0), 0u);
    EXPECT_NE(picture.find("<polyline"), std::string::npos);
    EXPECT_NE(picture.find("validation"), std::string::npos);
  }
}

TEST(Trainer, LossCurveOfNothingIsStillAPicture) {
  EXPECT_NE(strategy::LossCurveSvg({}).find("</svg>"), std::string::npos);
}

// args: "save" PATH steps FORMAT | "load" PATH first end. Trains, then
// saves a checkpoint in FORMAT; or loads one (saved on any number of ranks)
// and trains on from step `first`.
FSDP2_SCENARIO(checkpoint_resume) {
  auto options = Options();
  if (args.at(0) == "save") options.checkpoint_format = strategy::ParseCheckpointFormat(args.at(3));
  strategy::FSDP2Strategy s(options);
  auto module = Prepare(s);
  const bool save = args.at(0) == "save";
  const std::string dir = args.at(1);
  int first = 0, end = std::stoi(args.at(2));
  if (!save) {
    first = std::stoi(args.at(2));
    end = std::stoi(args.at(3));
    s.load_checkpoint(dir);
    if (s.current_epoch_step().step != first) throw std::runtime_error("step counter not restored");
  }
  auto loader = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  std::ofstream out(WorkerOutDir() + "/losses" + std::to_string(s.world()->rank()) + ".txt");
  out.precision(17);
  for (int i = first; i < end; ++i) {
    at::Tensor loss = s.training_step(loader.batch(i), i);
    s.backward(loss);
    s.optimizer_step();
    out << s.reduce(loss).item<double>() << "\n";
  }
  if (save) s.save_checkpoint(dir);
}

TEST(FSDP2Strategy, CheckpointsResumeOnAnyNumberOfRanks) {
  const int steps = 6;
  const auto ref = ReferenceLosses(steps);
  for (const std::string format : {"sharded", "full"})
  for (int saved : {2, 4}) {
    const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/ckpt_" + format +
                            std::to_string(saved);
    LaunchOptions o;
    o.scenario = "checkpoint_resume";
    o.timeout = std::chrono::seconds(180);
    o.world_size = saved;
    o.args = {"save", dir, "3", format};
    auto first = LaunchRanks(o);
    ASSERT_TRUE(first.ok()) << first.Describe();
    for (int loaded : {1, 2, 3, 4}) {
      o.world_size = loaded;
      o.args = {"load", dir, "3", std::to_string(steps)};
      auto second = LaunchRanks(o);
      ASSERT_TRUE(second.ok()) << "saved on " << saved << ", loaded on " << loaded << "\n"
                               << second.Describe();
      auto a = ReadNumbers(first.out_dir + "/losses0.txt");
      auto b = ReadNumbers(second.out_dir + "/losses0.txt");
      a.insert(a.end(), b.begin(), b.end());
      ASSERT_EQ(a.size(), ref.size());
      for (int i = 0; i < steps; ++i) {
        EXPECT_NEAR(a[i], ref[i], 1e-11 * ref[i])
            << format << " saved on " << saved << ", loaded on " << loaded << ", step " << i;
      }
    }
    std::printf("%s checkpoint saved on %d ranks resumes on 1, 2, 3 and 4 ranks with the "
                "uninterrupted losses\n", format.c_str(), saved);
  }
}

// Each broken checkpoint gives an error naming the file or parameter, and
// leaves the model as it was.
FSDP2_SCENARIO(checkpoint_errors) {
  namespace fs = std::filesystem;
  strategy::FSDP2Strategy s(Options());
  auto module = Prepare(s);
  TrainOneStep(s);
  const std::string dir = WorkerOutDir() + "/ckpt";
  s.save_checkpoint(dir);
  s.save_checkpoint(dir);  // replacing a checkpoint works too
  // Optimizer hyper-parameters come back with the checkpoint, and
  // metadata.json says which rows each file holds.
  auto lr = [&]() -> torch::optim::AdamWOptions& {
    return static_cast<torch::optim::AdamWOptions&>(s.optimizer().param_groups()[0].options());
  };
  lr().lr(0.5);
  s.load_checkpoint(dir);
  if (lr().lr() != 1e-2) throw std::runtime_error("learning rate not restored");
  {
    nlohmann::json m;
    std::ifstream(dir + "/metadata.json") >> m;
    if (m["files"]["rank0-of-1.safetensors"]["ln_f.weight"] != nlohmann::json({0, 16})) {
      throw std::runtime_error("metadata.json lacks the rows of each file: " + m["files"].dump());
    }
  }
  auto before = s.lightning_module_state_dict();
  auto expect = [&](const std::string& path, const std::string& text) {
    try {
      s.load_checkpoint(path);
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find(text) == std::string::npos) {
        throw std::runtime_error("error '" + std::string(e.what()) + "' lacks '" + text + "'");
      }
      auto after = s.lightning_module_state_dict();
      for (size_t i = 0; i < before.size(); ++i) {
        if (!after[i].second.equal(before[i].second)) {
          throw std::runtime_error("a failed load changed " + after[i].first);
        }
      }
      return;
    }
    throw std::runtime_error("loading " + path + " should fail with '" + text + "'");
  };
  auto copy = [&](const std::string& name) {
    const std::string to = WorkerOutDir() + "/" + name;
    fs::remove_all(to);
    fs::copy(dir, to);
    return to;
  };
  expect(WorkerOutDir() + "/nothing", "no such checkpoint directory");
  expect(dir + "/metadata.json", "not a safetensors file");  // a file: read as full
  auto no_meta = copy("no_meta");
  fs::remove(no_meta + "/metadata.json");
  expect(no_meta, "not an fsdp2 sharded checkpoint");
  auto no_shard = copy("no_shard");
  fs::remove(no_shard + "/rank0-of-1.safetensors");
  expect(no_shard, "missing shard file");
  auto corrupt = copy("corrupt");
  {
    std::fstream f(corrupt + "/rank0-of-1.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x55');
  }
  expect(corrupt, "checksum mismatch");
  auto reshaped = copy("reshaped");
  {
    nlohmann::json m;
    std::ifstream(reshaped + "/metadata.json") >> m;
    m["params"]["ln_f.weight"]["shape"] = {17};
    std::ofstream(reshaped + "/metadata.json") << m.dump();
  }
  expect(reshaped, "parameter 'ln_f.weight' has shape [17]");
  auto retyped = copy("retyped");
  {
    nlohmann::json m;
    std::ifstream(retyped + "/metadata.json") >> m;
    m["params"]["ln_f.weight"]["dtype"] = "Float";
    std::ofstream(retyped + "/metadata.json") << m.dump();
  }
  expect(retyped, "parameter 'ln_f.weight' is Float but the model's is Double");
  auto extra = copy("extra");
  {
    nlohmann::json m;
    std::ifstream(extra + "/metadata.json") >> m;
    m["params"]["head.weight"] = {{"shape", {1}}, {"dtype", "Double"}};
    std::ofstream(extra + "/metadata.json") << m.dump();
  }
  expect(extra, "holds parameter 'head.weight', which the model does not have");
  // An optimizer of another kind, or over other parameters, is refused
  // before anything is loaded.
  auto expect_refused = [&](torch::optim::Optimizer& other, const std::string& text) {
    try {
      checkpoint::LoadShardedCheckpoint(dir, *module->module(), &other, *s.world());
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find(text) != std::string::npos) return;
      throw std::runtime_error("error '" + std::string(e.what()) + "' lacks '" + text + "'");
    }
    throw std::runtime_error("loading into a mismatched optimizer should fail with '" + text + "'");
  };
  auto params = module->module()->parameters();
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
  expect_refused(sgd, "holds adamw optimizer state but the optimizer is sgd");
  torch::optim::AdamW partial(std::vector<at::Tensor>(params.begin(), params.begin() + 3));
  expect_refused(partial, "which the optimizer does not hold");

  // remove_checkpoint refuses what it did not write and removes what it did.
  bool refused = false;
  try {
    s.remove_checkpoint(no_meta);
  } catch (const std::runtime_error& e) {
    refused = std::string(e.what()).find("refusing") != std::string::npos;
  }
  if (!refused || !fs::exists(no_meta)) throw std::runtime_error("removed a non-checkpoint");
  s.remove_checkpoint(dir);
  if (fs::exists(dir)) throw std::runtime_error("checkpoint not removed");

  // The full format (a file): it loads; a corrupted byte is caught by rank
  // 0's checksum pass; remove_checkpoint removes it.
  const std::string full = WorkerOutDir() + "/full";
  const std::string file = full + "/checkpoint.safetensors";
  checkpoint::SaveFullCheckpoint(full, *module->module(), &s.optimizer(), *s.world(), {});
  s.load_checkpoint(full);
  // Python, with docs/checkpoints.md's lines: the file holds the model's state.
  const std::string state = WorkerOutDir() + "/state.safetensors";
  checkpoint::WriteSafetensors(state, s.lightning_module_state_dict());
  const std::string check = std::string(FSDP2_PYTHON) + " core/checkpoint/load_safetensors.py " + file +
                            " " + state;
  if (std::system(check.c_str()) != 0) throw std::runtime_error("python check failed: " + check);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x55');
  }
  expect(full, "checksum mismatch");
  {
    checkpoint::NamedTensors as_float;
    for (auto& kv : s.lightning_module_state_dict()) as_float.emplace_back(kv.first, kv.second.to(at::kFloat));
    checkpoint::WriteSafetensors(file, as_float, {{"fsdp2.checkpoint", "fsdp2.full.v1"},
                                                  {"optimizer", "adamw"}, {"progress", "{}"}});
  }
  expect(full, "is Float but the model's is Double");
  s.remove_checkpoint(full);
  if (fs::exists(full)) throw std::runtime_error("full checkpoint not removed");
}

// args: FORMAT. A checkpoint target is a directory in both formats: an
// empty one, one holding a checkpoint of either format, and a new one take
// a save; a file, a foreign directory and an unwritable place are refused
// on every rank (no hang), and by Trainer::fit before its first step.
FSDP2_SCENARIO(checkpoint_targets) {
  namespace fs = std::filesystem;
  const std::string format = args.at(0);
  auto options = Options();
  options.checkpoint_format = strategy::ParseCheckpointFormat(format);
  strategy::FSDP2Strategy s(options);
  auto module = Prepare(s);
  TrainOneStep(s);
  const bool rank0 = s.world()->rank() == 0;
  const std::string out = WorkerOutDir();
  auto listing = [](const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    std::string joined;
    for (const auto& n : names) joined += n + " ";
    return joined;
  };
  const std::string want = format == "full" ? "checkpoint.safetensors "
                                            : "metadata.json rank0-of-2.safetensors "
                                              "rank1-of-2.safetensors ";
  const auto saved = s.lightning_module_state_dict();
  auto expect_saved_state = [&](const std::string& what) {
    auto now = s.lightning_module_state_dict();
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!now[i].second.equal(saved[i].second)) throw std::runtime_error(what + ": " + now[i].first);
    }
  };
  // An existing empty directory; then the same directory again.
  const std::string empty = out + "/empty";
  if (rank0) fs::create_directories(empty);
  s.barrier();
  s.check_checkpoint_target(empty);
  s.save_checkpoint(empty);
  s.save_checkpoint(empty);
  if (listing(empty) != want) throw std::runtime_error("layout of " + format + ": " + listing(empty));
  s.load_checkpoint(empty);
  expect_saved_state("load from an empty directory");
  // A directory holding a checkpoint of the other format is replaced.
  const std::string other = out + "/other";
  if (format == "full") {
    checkpoint::SaveShardedCheckpoint(other, *module->module(), &s.optimizer(), *s.world(), {});
  } else {
    checkpoint::SaveFullCheckpoint(other, *module->module(), &s.optimizer(), *s.world(), {});
  }
  s.check_checkpoint_target(other);
  s.save_checkpoint(other);
  if (listing(other) != want) throw std::runtime_error("replaced: " + listing(other));
  // A new directory under new parents.
  const std::string fresh = out + "/a/b/fresh";
  s.check_checkpoint_target(fresh);
  if (fs::exists(out + "/a")) throw std::runtime_error("the check created directories");
  s.save_checkpoint(fresh);
  s.load_checkpoint(fresh);
  expect_saved_state("load from a new directory");
  if (format == "full") {  // an earlier fsdp2's single file still loads
    const std::string single = out + "/single.safetensors";
    if (rank0) fs::copy_file(fresh + "/checkpoint.safetensors", single);
    s.barrier();
    s.load_checkpoint(single);
    expect_saved_state("load from a single file");
    s.remove_checkpoint(single);
    if (fs::exists(single)) throw std::runtime_error("single-file checkpoint not removed");
  }
  // Bad targets: refused on every rank, the foreign files untouched.
  const std::string file = out + "/a_file", foreign = out + "/foreign";
  if (rank0) {
    std::ofstream(file) << "mine";
    fs::create_directories(foreign);
    std::ofstream(foreign + "/notes.txt") << "mine";
  }
  s.barrier();
  auto expect_refused = [&](const std::string& target, const std::string& text) {
    for (int how = 0; how < 3; ++how) {
      try {
        if (how == 0) {
          s.check_checkpoint_target(target);
        } else if (how == 1) {
          s.save_checkpoint(target);
        } else {  // Trainer::fit, before its first step
          strategy::TrainerOptions t;
          t.max_steps = s.current_epoch_step().step + 2;
          t.checkpoint_every_n_steps = 1;
          t.checkpoint_dir = target;
          t.progress_bar = 0;
          t.log_every_n_steps = 1000;
          auto loader = s.process_dataloader(Dataset(kRows), kGlobalBatch);
          const int64_t before = s.current_epoch_step().step;
          strategy::Trainer trainer(s, t);
          try {
            trainer.fit(loader);
          } catch (...) {
            if (s.current_epoch_step().step != before || !trainer.history().empty()) {
              throw std::runtime_error("Trainer::fit trained before refusing " + target);
            }
            throw;
          }
        }
      } catch (const std::runtime_error& e) {
        const std::string msg = e.what();
        if (rank0 && msg.find(text) == std::string::npos) {
          throw std::runtime_error("error '" + msg + "' lacks '" + text + "'");
        }
        continue;
      }
      throw std::runtime_error(target + " should be refused with '" + text + "'");
    }
  };
  expect_refused(file, "exists and is a file");
  expect_refused(file + "/ckpt", "is a file, not a directory");
  expect_refused(foreign, "holds 'notes.txt', which is not part of an fsdp2 checkpoint");
  expect_refused("/proc/fsdp2_ckpt", "cannot be written");
  std::string text;
  std::ifstream(foreign + "/notes.txt") >> text;
  if (text != "mine" || listing(foreign) != "notes.txt ") throw std::runtime_error("foreign files touched");
  // Trainer::fit with a good checkpoint_dir saves there itself.
  strategy::TrainerOptions t;
  t.max_steps = s.current_epoch_step().step + 1;
  t.checkpoint_every_n_steps = 1;
  t.checkpoint_dir = out + "/by_trainer";
  t.progress_bar = 0;
  auto loader = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  strategy::Trainer(s, t).fit(loader);
  if (listing(t.checkpoint_dir) != want) throw std::runtime_error("trainer: " + listing(t.checkpoint_dir));
}

// Reads a whole file.
std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// args: FORMAT. A background save, held back until two training steps have
// run, writes the same bytes as a synchronous save of the same state; the
// next save waits for it; it loads back as the state at the save.
FSDP2_SCENARIO(background_save) {
  namespace fs = std::filesystem;
  auto options = Options();
  options.checkpoint_format = strategy::ParseCheckpointFormat(args.at(0));
  strategy::FSDP2Strategy s(options);
  auto module = Prepare(s);
  TrainOneStep(s);
  const bool rank0 = s.world()->rank() == 0;
  const std::string sync = WorkerOutDir() + "/sync", async = WorkerOutDir() + "/async";
  s.save_checkpoint(sync);
  const auto saved = s.lightning_module_state_dict();

  std::mutex mu;
  std::condition_variable cv;
  int steps_done = 0;
  checkpoint::BackgroundSaver::SetGateForTesting([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return steps_done >= 2; });
  });
  s.save_checkpoint(async, /*async=*/true);
  if (!s.checkpoint_in_flight()) throw std::runtime_error("the background save is not in flight");
  // Training goes on while the save waits to be written.
  auto loader = s.process_dataloader(Dataset(kRows), kGlobalBatch);
  for (int i = 1; i <= 2; ++i) {
    s.backward(s.training_step(loader.batch(i), i));
    s.optimizer_step();
    if (!s.checkpoint_in_flight()) throw std::runtime_error("written before the steps ran");
    std::lock_guard<std::mutex> lock(mu);
    ++steps_done;
    cv.notify_all();
  }
  // The next save waits for the one in flight.
  s.save_checkpoint(WorkerOutDir() + "/next", /*async=*/true);
  if (rank0 && !fs::exists(async)) throw std::runtime_error("the next save did not wait");
  s.wait_for_checkpoint();
  checkpoint::BackgroundSaver::SetGateForTesting(nullptr);
  s.barrier();
  if (rank0) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(sync)) names.push_back(e.path().filename().string());
    if (names.empty()) throw std::runtime_error("nothing saved");
    for (const auto& name : names) {
      if (Bytes(sync + "/" + name) != Bytes(async + "/" + name)) {
        throw std::runtime_error(name + " differs between the synchronous and background save");
      }
    }
    size_t async_files = 0;
    for (const auto& e : fs::directory_iterator(async)) async_files += e.is_regular_file();
    if (async_files != names.size()) throw std::runtime_error("other files in the background save");
  }
  s.load_checkpoint(async);
  if (s.current_epoch_step().step != 1) throw std::runtime_error("step counter of the save");
  auto now = s.lightning_module_state_dict();
  for (size_t i = 0; i < saved.size(); ++i) {
    if (!now[i].second.equal(saved[i].second)) throw std::runtime_error("loaded " + now[i].first);
  }
  std::ofstream(WorkerOutDir() + "/steps_during_save" + std::to_string(s.world()->rank()))
      << steps_done;
}

TEST(FSDP2Strategy, BackgroundSavesEqualSynchronousOnesWhileTrainingGoesOn) {
  for (const std::string format : {"sharded", "full"}) {
    auto r = LaunchScenario("background_save", 2, {format}, std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << format << "\n" << r.Describe();
    EXPECT_EQ(ReadFile(r.out_dir + "/steps_during_save0"), "2") << format;
  }
}

TEST(FSDP2Strategy, CheckpointTargetsAreDirectoriesInBothFormats) {
  for (const std::string format : {"sharded", "full"}) {
    auto r = LaunchScenario("checkpoint_targets", 2, {format}, std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << format << "\n" << r.Describe();
  }
}

// args: DIR DELAY_MS. Saves the same state to DIR once, then over and over
// until it kills itself (SIGKILL) DELAY_MS later, whatever it is doing then:
// no deadline of the harness races with the setup.
FSDP2_SCENARIO(save_forever) {
  strategy::FSDP2Strategy s(Options());
  Prepare(s);
  TrainOneStep(s);
  s.save_checkpoint(args.at(0));
  std::ofstream(WorkerOutDir() + "/saved_once" + std::to_string(s.world()->rank())).put('1');
  const int delay_ms = std::stoi(args.at(1));
  std::thread([delay_ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    raise(SIGKILL);
  }).detach();
  for (;;) s.save_checkpoint(args.at(0));
}

// Loads DIR and writes the full parameters, for comparison.
FSDP2_SCENARIO(load_and_dump) {
  strategy::FSDP2Strategy s(Options());
  Prepare(s);
  s.load_checkpoint(args.at(0));
  std::vector<at::Tensor> values;
  for (auto& kv : s.lightning_module_state_dict()) values.push_back(kv.second);
  if (s.world()->rank() == 0) torch::save(values, WorkerOutDir() + "/params.pt");
}

TEST(FSDP2Strategy, KilledDuringSaveLeavesALoadableCheckpoint) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/killed";
  std::vector<at::Tensor> first_load;
  for (int attempt = 0; attempt < 4; ++attempt) {
    // Every rank SIGKILLs itself a while after its first save, most likely
    // in the middle of one (they save back to back); the delays differ so
    // that the kills land at different points.
    auto r = LaunchScenario("save_forever", 2, {dir, std::to_string(7 + 23 * attempt)},
                            std::chrono::seconds(180));
    for (const auto& rank : r.ranks) {
      ASSERT_FALSE(rank.timed_out) << r.Describe();
      ASSERT_EQ(rank.exit_code, 128 + SIGKILL) << "the ranks should be killed\n" << r.Describe();
    }
    // Rank 0 returns from a save once the checkpoint is in place.
    ASSERT_TRUE(std::ifstream(r.out_dir + "/saved_once0").good())
        << "not one save completed before the kill\n" << r.Describe();
    auto loaded = LaunchScenario("load_and_dump", 2, {dir}, std::chrono::seconds(120));
    ASSERT_TRUE(loaded.ok()) << "after a kill mid-save:\n" << loaded.Describe();
    std::vector<at::Tensor> values;
    torch::load(values, loaded.out_dir + "/params.pt");
    if (first_load.empty()) {
      first_load = values;
    } else {
      ASSERT_EQ(values.size(), first_load.size());
      for (size_t i = 0; i < values.size(); ++i) EXPECT_TRUE(values[i].equal(first_load[i]));
    }
  }
}

TEST(FSDP2Strategy, CorruptionIsFoundOnAnotherWorldSizeToo) {
  // Saved on 2 ranks, one byte of rank 1's file flipped, loaded on 3.
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/corrupt2";
  LaunchOptions o;
  o.scenario = "checkpoint_resume";
  o.timeout = std::chrono::seconds(120);
  o.world_size = 2;
  o.args = {"save", dir, "1", "sharded"};
  ASSERT_TRUE(LaunchRanks(o).ok());
  {
    std::fstream f(dir + "/rank1-of-2.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-7, std::ios::end);
    const char byte = static_cast<char>(f.get());
    f.seekp(-7, std::ios::end);
    f.put(static_cast<char>(~byte));  // certainly a different byte
  }
  o.world_size = 3;
  o.args = {"load", dir, "1", "2"};
  auto r = LaunchRanks(o);
  ASSERT_FALSE(r.ok());
  bool named = false;
  for (const auto& rank : r.ranks) {
    named = named || rank.log.find("checksum mismatch") != std::string::npos;
  }
  EXPECT_TRUE(named) << r.Describe();
}

TEST(FSDP2Strategy, BrokenCheckpointsAreClearErrors) {
  auto r = LaunchScenario("checkpoint_errors", 1, {}, std::chrono::seconds(120));
  EXPECT_TRUE(r.ok()) << r.Describe();
}

TEST(FSDP2Strategy, BadOptionsSayWhatToChange) {
  auto expect_invalid = [](strategy::FSDP2StrategyOptions o, const std::string& text,
                           bool at_setup) {
    try {
      strategy::FSDP2Strategy s(o);
      if (at_setup) s.setup_environment();
      FAIL() << "expected std::invalid_argument containing '" << text << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  auto o = Options();
  o.data_parallel_size = strategy::ParallelSize::Of(-1);
  expect_invalid(o, "must be \"auto\" or a positive integer", false);
  o = Options();
  o.gpu_memory_limit_gib = -1;
  expect_invalid(o, "gpu_memory_limit_gib", false);
  // A backend is a comm::Backend: its name is parsed where it comes in.
  EXPECT_THROW(comm::ParseBackend("mpi"), std::invalid_argument);
  o = Options();  // this test process is a world of 1
  o.data_parallel_size = strategy::ParallelSize::Of(2);
  expect_invalid(o, "data_parallel_size 2 does not divide the world size 1", true);
  o = Options();
  o.tensor_parallel_size = strategy::ParallelSize::Of(2);
  expect_invalid(o, "does not divide the world size", true);
  o = Options();
  o.sharding_strategy = fsdp::ShardingStrategy::kHybridShard;
  o.shard_group_size = 3;
  expect_invalid(o, "HYBRID_SHARD needs a 2-D", true);
  // fully_shard's controls by name, refused by parallelize().
  // A file store each: a sharded module that died keeps its process group
  // (and a TCP store's port) until the next fully_shard() prunes it.
  int stores = 0;
  auto expect_parallelize_invalid = [&stores](strategy::FSDP2StrategyOptions o,
                                              const std::string& text) {
    const std::string store = std::string(std::getenv("TEST_TMPDIR")) + "/bad_options_store" +
                              std::to_string(stores++);
    setenv("FSDP2_STORE_PATH", store.c_str(), 1);
    strategy::FSDP2Strategy s(o);
    s.setup_environment();
    s.connect(std::make_shared<CountingGPTModule>());
    try {
      s.parallelize();
      FAIL() << "expected std::invalid_argument containing '" << text << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
    unsetenv("FSDP2_STORE_PATH");
  };
  o = Options();
  o.ignored_params = {"wte.weight", "blocks.*.nothing"};
  expect_parallelize_invalid(o, "ignored_params pattern 'blocks.*.nothing' matches no parameter");
  o = Options();
  o.forward_prefetch_modules = {{"blocks.0", {"blocks.7"}}};
  expect_parallelize_invalid(o, "names 'blocks.7', which is not a module of the model");
  o = Options();
  o.backward_prefetch_modules = {{"blocks.1", {"blocks.0.attn"}}};
  expect_parallelize_invalid(o, "'blocks.0.attn', which is not a sharded module");
  o = Options();
  o.forward_prefetch_modules = {{"blocks.1", {"blocks.0"}}};
  expect_parallelize_invalid(o, "names 'blocks.0', which the forward reaches before it");
  o = Options();
  o.backward_prefetch_modules = {{"blocks.0", {"blocks.1"}}};
  expect_parallelize_invalid(o, "names 'blocks.1', which the backward reaches before it");
  o = Options();
  EXPECT_THROW(o.set_reshard_after_forward(-2), std::invalid_argument);
  o.set_reshard_after_forward(4);
  EXPECT_TRUE(!o.reshard_after_forward.has_value() && o.reshard_after_forward_size == 4);
  o.set_reshard_after_forward(0);
  EXPECT_TRUE(o.reshard_after_forward == false && o.reshard_after_forward_size == 0);
  EXPECT_EQ(strategy::ParallelSize::Parse("auto").ToString(), "auto");
  EXPECT_EQ(*strategy::ParallelSize::Parse("4").value, 4);
  EXPECT_THROW(strategy::ParallelSize::Parse("four"), std::invalid_argument);
}

TEST(FSDP2Strategy, CallsInTheWrongOrderAreLogicErrors) {
  strategy::FSDP2Strategy s(Options());
  EXPECT_THROW(s.training_step({at::ones({1, 4})}, 0), std::logic_error);
  EXPECT_THROW(s.parallelize(), std::logic_error);
  EXPECT_THROW(s.barrier(), std::logic_error);
  EXPECT_THROW(s.connect(nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
