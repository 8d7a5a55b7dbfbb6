// FSDP2Strategy on CUDA tensors, where a GPU is: one rank, and two ranks
// sharing the one GPU through the host-staged transport (NCCL refuses two
// ranks on one device; this runs the engine's multi-rank logic, gathers,
// reduce-scatters and clipping across shards, on CUDA tensors), each equal to
// one process training the same model on the same GPU; activation
// checkpointing bit-identical to training without it, and a lower device
// peak with it; checkpoints that move between the GPU and the CPU both ways;
// a model built under tensor_init_context() deferred until parallelize()
// and materialised on the GPU, equal to an eager build; background saves
// from the GPU, written while training goes on; tensor parallelism and
// HYBRID_SHARD.
// Built in every run. Where no CUDA device is visible it prints a SKIPPED:
// line and runs nothing, unless
//   FSDP2_GPU_TEST_DRY_RUN=1  every "cuda" is the CPU and "nccl" gloo: the
//                             tests' logic on a machine without a GPU
//                             (//tests:gpu_test_dry_run, in every run);
//   FSDP2_REQUIRE_GPU=1       (the GPU check) no device is a failure: exit 1.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/checkpoint/background_saver.h"
#include "core/fsdp/deferred_init.h"
#include "core/models/gpt_module.h"
#include "core/strategy/fsdp2_strategy.h"
#include "tests/harness/multi_process.h"
#include "tests/strategy_util.h"
#include "tests/training_util.h"

namespace fsdp2 {
namespace testing {
namespace {

constexpr uint64_t kSeed = 5;
constexpr uint64_t kSamplerSeed = 11;
constexpr int64_t kRows = 64;
constexpr int64_t kGlobalBatch = 8;

models::GPTConfig Config() {
  models::GPTConfig c = TinyGPT();
  c.n_embd = 32;
  c.n_head = 4;
  return c;
}

// FSDP2_GPU_TEST_DRY_RUN=1: every "cuda" below is the CPU and "nccl" gloo,
// so that the tests' own logic runs on a machine without a GPU.
bool DryRun() {
  const char* v = std::getenv("FSDP2_GPU_TEST_DRY_RUN");
  return v != nullptr && std::string(v) == "1";
}
// FSDP2_REQUIRE_GPU=1: a missing GPU is a failure, not a skip.
bool RequireGpu() {
  const char* v = std::getenv("FSDP2_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}
std::string Device(const std::string& name) { return DryRun() && name == "cuda" ? "cpu" : name; }
std::string Backend(const std::string& name) { return DryRun() ? "gloo" : name; }

at::ScalarType DtypeOf(const std::string& name) {
  return name == "f64" ? at::kDouble : at::kFloat;
}

strategy::DistributedSamplerOptions Sampler() {
  return TestSamplerOptions(kSamplerSeed, kGlobalBatch);
}

// args: device backend dtype(f32|f64) activation_checkpointing(0|1) steps
//       save|- load_dir|- [build [layout]]
// save: DIR (a sharded save after training), or "async:DIR" /
// "async-full:DIR" (a background save, sharded or full, after training,
// then one more step while it is written: the save is held back until that
// step has run, and must still be in flight then). build: "eager" (default)
// or "deferred" (the model built under tensor_init_context(): every
// parameter deferred until parallelize(), none after). layout: "dp"
// (default: every rank data-parallel, FULL_SHARD), "tp2" (tensor-parallel
// pairs) or "hsdp2" (HYBRID_SHARD, shard groups of two). offload:
// "offload" (cpu_offload: every shard in host memory, pinned on a GPU) or
// "-" (default). clip: the norm every step clips to, told to backward()
// (default 1.0; 0: with offload, each unit steps during the backward).
// Writes losses<rank>.txt, params.pt (rank 0: the full parameters after
// training, on the CPU, in named_parameters() order) and device<rank>.txt
// (the device and its peak allocated bytes).
FSDP2_SCENARIO(gpu_train) {
  strategy::FSDP2StrategyOptions o = TestStrategyOptions(kSeed, kSamplerSeed);
  o.device = strategy::DeviceSpec::Parse(Device(args.at(0)));
  o.backend = comm::ParseBackend(Backend(args.at(1)));
  if (args.at(3) == "1") o.activation_checkpointing = fsdp::ActivationCheckpointing::Full();
  const int steps = std::stoi(args.at(4));
  std::string save = args.at(5);
  const std::string load = args.at(6);
  const bool deferred = args.size() > 7 && args.at(7) == "deferred";
  const std::string layout = args.size() > 8 ? args.at(8) : "dp";
  const bool offload = args.size() > 9 && args.at(9) == "offload";
  const double clip = args.size() > 10 ? std::stod(args.at(10)) : 1.0;
  o.cpu_offload = offload;
  if (layout == "tp2") o.tensor_parallel_size = strategy::ParallelSize::Of(2);
  if (layout == "hsdp2") {
    o.sharding_strategy = fsdp::ShardingStrategy::kHybridShard;
    o.shard_group_size = 2;
  }
  const bool async = save.rfind("async", 0) == 0;
  if (save.rfind("async-full:", 0) == 0) o.checkpoint_format = strategy::CheckpointFormat::kFull;
  if (async) save = save.substr(save.find(':') + 1);
  strategy::FSDP2Strategy s(o);
  s.setup_environment();
  Check(s.tensor_parallel_size() == (layout == "tp2" ? 2 : 1), "the mesh's tensor-parallel size");
  std::shared_ptr<models::GPTModule> module;
  {
    std::optional<fsdp::DeferredInitGuard> init;
    if (deferred) init.emplace(s.tensor_init_context());
    module = std::make_shared<models::GPTModule>(Config(), TestOptimizer("adamw"),
                                                 DtypeOf(args.at(2)));
  }
  for (const auto& p : module->module()->parameters()) {
    Check(fsdp::is_deferred(p) == deferred,
          deferred ? "under tensor_init_context() every parameter is deferred (no memory) "
                     "until parallelize()"
                   : "an eager build's parameters are real tensors");
  }
  s.connect(module);
  s.parallelize();
  Check(!fsdp::has_deferred_tensors(*module->module()), "parallelize() materialised everything");
  if (load != "-") s.load_checkpoint(load);
  const int rank = s.world()->rank();
  auto loader = s.process_dataloader(TokenWindows(Config().vocab_size, kRows), kGlobalBatch);
  std::ofstream out(WorkerOutDir() + "/losses" + std::to_string(rank) + ".txt");
  out.precision(17);
  // After a load, the batches from the step it restored on.
  const int first = static_cast<int>(s.current_epoch_step().step);
  for (int i = first; i < first + steps; ++i) {
    at::Tensor loss = s.training_step(loader.batch(i), i);
    Check(loss.device() == s.device(), "the loss on the strategy's device");
    s.backward(loss, /*sync_gradients=*/true, clip);
    s.optimizer_step(clip);
    out << s.reduce(loss).item<double>() << "\n";
  }
  for (const auto& p : module->module()->parameters()) {
    if (!offload) {
      Check(p.device() == s.device(), "every parameter shard on the strategy's device");
    } else {
      Check(p.is_cpu(), "with cpu_offload every parameter shard in host memory");
      Check(s.device().is_cpu() || p.is_pinned(),
            "with cpu_offload on a GPU every shard in page-locked memory");
    }
  }
  // A background save's write waits here until the step after it has run:
  // a save written before save_checkpoint() returns (synchronously) would
  // wait in vain, and be found written when the step is done.
  std::mutex mu;
  std::condition_variable stepped_cv;
  bool stepped = false, written_after_step = false;
  if (async) {
    checkpoint::BackgroundSaver::SetGateForTesting([&] {
      std::unique_lock<std::mutex> lock(mu);
      stepped_cv.wait_for(lock, std::chrono::seconds(20), [&] { return stepped; });
      written_after_step = stepped;
    });
  }
  // A background save's write waits here until the step after it has run:
  // a save written before save_checkpoint() returns (synchronously) would
  // wait in vain, and be found written when the step is done.
  // (Shared with the gate: a failed check below leaves it valid.)
  struct Gate {
    std::mutex mu;
    std::condition_variable stepped_cv;
    bool stepped = false, written_after_step = false;
  };
  const auto gate = std::make_shared<Gate>();
  if (async) {
    checkpoint::BackgroundSaver::SetGateForTesting([gate] {
      std::unique_lock<std::mutex> lock(gate->mu);
      gate->stepped_cv.wait_for(lock, std::chrono::seconds(20), [&] { return gate->stepped; });
      gate->written_after_step = gate->stepped;
    });
  }
  if (save != "-") s.save_checkpoint(save, async);
  if (async) {  // a step that changes every shard while the save is written
    s.backward(s.training_step(loader.batch(first + steps), first + steps));
    s.optimizer_step(/*max_grad_norm=*/1.0);
    Check(s.checkpoint_in_flight(), "the background save is still in flight after the step");
    {
      std::lock_guard<std::mutex> lock(gate->mu);
      gate->stepped = true;
    }
    gate->stepped_cv.notify_all();
    s.wait_for_checkpoint();
    checkpoint::BackgroundSaver::SetGateForTesting(nullptr);
    Check(gate->written_after_step, "the background save was written after the step, not before");
  }
  const auto stats = s.memory_stats();
  std::ofstream(WorkerOutDir() + "/device" + std::to_string(rank) + ".txt")
      << s.device().str() << " " << stats.peak_device_allocated_bytes << "\n";
  auto full = s.lightning_module_state_dict(/*rank0_only=*/true);
  if (rank == 0) {
    std::vector<at::Tensor> values;
    for (auto& kv : full) values.push_back(kv.second.to(at::kCPU));
    torch::save(values, WorkerOutDir() + "/params.pt");
  }
  s.barrier();
  s.teardown();
}

// args: device backend activation_checkpointing(0|1). A 4-block float32
// GPT on one rank, one global batch of many rows (on the GPU: 4096 rows of
// 8 tokens, so that each block's activations, tens of MiB, outweigh
// everything else the step holds), two steps. Writes ac.txt: how many
// modules parallelize() checkpointed, and the device's peak allocated bytes
// (0 on the CPU).
FSDP2_SCENARIO(gpu_ac_memory) {
  strategy::FSDP2StrategyOptions o = TestStrategyOptions(kSeed, kSamplerSeed);
  o.device = strategy::DeviceSpec::Parse(Device(args.at(0)));
  o.backend = comm::ParseBackend(Backend(args.at(1)));
  if (args.at(2) == "1") o.activation_checkpointing = fsdp::ActivationCheckpointing::Full();
  strategy::FSDP2Strategy s(o);
  s.setup_environment();
  models::GPTConfig config = Config();
  config.n_layer = 4;
  auto module = std::make_shared<models::GPTModule>(config, TestOptimizer("adamw"), at::kFloat);
  s.connect(module);
  s.parallelize();
  const int64_t rows = s.device().is_cpu() ? 64 : 4096;
  auto loader = s.process_dataloader(TokenWindows(config.vocab_size, rows), rows);
  for (int i = 0; i < 2; ++i) {
    s.backward(s.training_step(loader.batch(0), i));
    s.optimizer_step(/*max_grad_norm=*/1.0);
  }
  std::ofstream(WorkerOutDir() + "/ac.txt")
      << s.checkpointed_modules().size() << " " << s.memory_stats().peak_device_allocated_bytes
      << "\n";
  s.teardown();
}

struct TrainResult {
  std::vector<double> losses;
  std::vector<at::Tensor> params;
};

TrainResult Launch(int n, std::vector<std::string> args) {
  const std::string device = Device(args.at(0));
  LaunchOptions o;
  o.world_size = n;
  o.scenario = "gpu_train";
  o.args = std::move(args);
  LaunchResult r = LaunchRanks(o);
  EXPECT_TRUE(r.ok()) << r.Describe();
  TrainResult run;
  if (!r.ok()) return run;
  run.losses = ReadNumbers(r.out_dir + "/losses0.txt");
  for (int rank = 1; rank < n; ++rank) {
    EXPECT_EQ(ReadNumbers(r.out_dir + "/losses" + std::to_string(rank) + ".txt"), run.losses);
  }
  const std::string used = ReadFile(r.out_dir + "/device0.txt");
  EXPECT_EQ(used.rfind(device, 0), 0u) << used;
  if (device != "cpu") {
    EXPECT_GT(std::stoll(used.substr(used.find(' ') + 1)), 0)
        << "the CUDA allocator's peak, through memory_stats()";
  }
  torch::load(run.params, r.out_dir + "/params.pt");
  return run;
}

// One process on the GPU, no FSDP: the same model, seed, batches, clipping.
TrainResult OneProcessOnGpu(at::ScalarType dtype, int steps) {
  torch::manual_seed(kSeed);
  models::GPTModule module(Config(), TestOptimizer("adamw"), dtype);
  const strategy::DistributedSampler sampler(kRows, 0, 1, Sampler());
  TrainResult run;
  run.losses = TrainOneProcess(module, TokenWindows(Config().vocab_size, kRows), sampler, steps,
                               /*clip=*/1.0, at::Device(Device("cuda")))
                   .losses;
  for (const auto& p : module.module()->parameters()) run.params.push_back(p.detach().cpu());
  return run;
}

// Losses within `rel` of each other; parameters within `rel` of their
// largest value, or `abs` (float32: AdamW turns the rounding of a near-zero
// gradient into an update of up to lr, so small parameters differ by a
// fraction of a step).
void ExpectClose(const TrainResult& got, const TrainResult& want, double rel, double abs,
                 const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], rel * std::abs(want.losses[i]))
        << what << ", step " << i;
  }
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (size_t i = 0; i < want.params.size(); ++i) {
    const double scale = want.params[i].abs().max().item<double>() + 1e-30;
    const double diff = (got.params[i].to(at::kDouble) - want.params[i].to(at::kDouble))
                            .abs().max().item<double>();
    EXPECT_LE(diff, std::max(rel * scale, abs)) << what << ", parameter " << i;
  }
}

TEST(Gpu, OneRankTrainsLikeOneProcess) {
  const TrainResult want = OneProcessOnGpu(at::kDouble, 5);
  ExpectClose(Launch(1, {"cuda", "nccl", "f64", "0", "5", "-", "-"}), want, 1e-10, 0,
              "N=1 on cuda, float64");
  const TrainResult want32 = OneProcessOnGpu(at::kFloat, 5);
  ExpectClose(Launch(1, {"cuda", "nccl", "f32", "0", "5", "-", "-"}), want32, 1e-5, 1e-4,
              "N=1 on cuda, float32 (lr 1e-2)");
}

TEST(Gpu, TwoRanksSharingTheGpuTrainLikeOneProcess) {
  const TrainResult want = OneProcessOnGpu(at::kDouble, 5);
  ExpectClose(Launch(2, {"cuda", "gloo", "f64", "0", "5", "-", "-"}), want, 1e-10, 0,
              "N=2 on one GPU (host-staged), float64");
}

TEST(Gpu, ActivationCheckpointingIsBitIdentical) {
  const TrainResult plain = Launch(1, {"cuda", "nccl", "f32", "0", "4", "-", "-"});
  const TrainResult recomputed = Launch(1, {"cuda", "nccl", "f32", "1", "4", "-", "-"});
  EXPECT_EQ(recomputed.losses, plain.losses);
  ASSERT_EQ(recomputed.params.size(), plain.params.size());
  for (size_t i = 0; i < plain.params.size(); ++i) {
    EXPECT_TRUE(recomputed.params[i].equal(plain.params[i])) << "parameter " << i;
  }
}

// Activation checkpointing keeps only each block's input from forward: on
// the GPU the step's peak falls well below training without it (the
// activations of 3 of the 4 blocks, most of the peak here). Everywhere (the
// dry run has no device peak): every block is checkpointed, and nothing
// without it.
TEST(Gpu, ActivationCheckpointingLowersThePeak) {
  std::vector<std::vector<int64_t>> runs;  // {checkpointed modules, peak} without, with
  for (const char* ac : {"0", "1"}) {
    LaunchOptions o;
    o.world_size = 1;
    o.scenario = "gpu_ac_memory";
    o.args = {"cuda", "nccl", ac};
    LaunchResult r = LaunchRanks(o);
    ASSERT_TRUE(r.ok()) << r.Describe();
    std::istringstream in(ReadFile(r.out_dir + "/ac.txt"));
    int64_t count = -1, peak = -1;
    in >> count >> peak;
    runs.push_back({count, peak});
  }
  EXPECT_EQ(runs[0][0], 0) << "modules checkpointed without activation checkpointing";
  EXPECT_EQ(runs[1][0], 4) << "modules checkpointed with it (the 4 blocks)";
  std::printf("device peak without activation checkpointing %lld B, with it %lld B\n",
              static_cast<long long>(runs[0][1]), static_cast<long long>(runs[1][1]));
  if (Device("cuda") != "cpu") {
    EXPECT_GT(runs[0][1], 0);
    EXPECT_LT(runs[1][1], runs[0][1] * 6 / 10)
        << "activation checkpointing must lower the device peak: " << runs[1][1] << " B with, "
        << runs[0][1] << " B without";
  }
}

TEST(Gpu, CheckpointsMoveBetweenGpuAndCpu) {
  const std::string dir = ::testing::TempDir() + "/gpu_ckpt";
  for (const auto& [from, to] : {std::make_pair("cuda", "cpu"), std::make_pair("cpu", "cuda")}) {
    SCOPED_TRACE(std::string(from) + " -> " + to);
    const std::string a = dir + "/" + from;
    const TrainResult saved = Launch(2, {from, "gloo", "f32", "0", "2", a, "-"});
    const TrainResult loaded = Launch(1, {to, "gloo", "f32", "0", "0", "-", a});
    ASSERT_EQ(loaded.params.size(), saved.params.size());
    for (size_t i = 0; i < saved.params.size(); ++i) {
      EXPECT_TRUE(loaded.params[i].equal(saved.params[i])) << "parameter " << i;
    }
  }
}

// CPU offload on the GPU, fp32, 8 steps (an epoch): with and without, the same
// training within 1e-6 (losses) and 1e-5 (parameters, relative to each
// one's largest value). Without offload AdamW is PyTorch's fused CUDA kernel;
// with it, fsdp2's fused AdamW on the host, whose roundings may differ in
// the last bit. Both with the steps after the backward (clipping) and
// during it (no clipping: each unit steps as its gradients land).
TEST(Gpu, CpuOffloadTrainsLikeWithout) {
  for (const char* clip : {"1.0", "0"}) {
    SCOPED_TRACE(std::string("clip ") + clip);
    const TrainResult off =
        Launch(1, {"cuda", "nccl", "f32", "0", "8", "-", "-", "eager", "dp", "-", clip});
    const TrainResult on =
        Launch(1, {"cuda", "nccl", "f32", "0", "8", "-", "-", "eager", "dp", "offload", clip});
    ExpectClose(on, off, 1e-6, 0, "cpu_offload, losses");
    ExpectClose(TrainResult{{}, on.params}, TrainResult{{}, off.params}, 1e-5, 0,
                "cpu_offload, parameters");
  }
}

// A checkpoint saved with offload resumes without it, and the other way
// round: 3 steps, a save, 2 more after the load, against 5 straight.
TEST(Gpu, CpuOffloadCheckpointsResumeEitherWay) {
  const std::string dir = ::testing::TempDir() + "/gpu_offload_ckpt";
  const TrainResult straight =
      Launch(1, {"cuda", "nccl", "f32", "0", "5", "-", "-", "eager", "dp", "-"});
  for (const char* saver : {"offload", "-"}) {
    const char* loader = std::string(saver) == "offload" ? "-" : "offload";
    SCOPED_TRACE(std::string("saved with ") + saver);
    const std::string ckpt = dir + "/" + (std::string(saver) == "-" ? "plain" : saver);
    Launch(1, {"cuda", "nccl", "f32", "0", "3", ckpt, "-", "eager", "dp", saver});
    const TrainResult resumed =
        Launch(1, {"cuda", "nccl", "f32", "0", "2", "-", ckpt, "eager", "dp", loader});
    ASSERT_EQ(resumed.losses.size(), 2u);
    ExpectClose(resumed, TrainResult{{straight.losses[3], straight.losses[4]}, straight.params},
                1e-6, 0, "resumed");
  }
}

// Tensor parallelism (dp 1 x tp 2) and HYBRID_SHARD (2 replicas x 2
// shards) on CUDA tensors, the ranks sharing the GPU: equal to one process.
TEST(Gpu, TensorParallelAndHybridShardTrainLikeOneProcess) {
  const TrainResult want = OneProcessOnGpu(at::kDouble, 4);
  ExpectClose(Launch(2, {"cuda", "gloo", "f64", "0", "4", "-", "-", "eager", "tp2"}), want, 1e-10,
              0, "tp 2 on one GPU (host-staged), float64");
  ExpectClose(Launch(4, {"cuda", "gloo", "f64", "0", "4", "-", "-", "eager", "hsdp2"}), want,
              1e-10, 0, "HYBRID_SHARD 2 x 2 on one GPU (host-staged), float64");
}

// tensor_init_context() on the GPU: each rank's rows are replayed on the CPU
// and land on the GPU, bit-identical to an eager build moved there, before
// and after training; one rank, and two sharing the GPU.
TEST(Gpu, DeferredInitOnTheGpuEqualsAnEagerBuild) {
  for (int n : {1, 2}) {
    SCOPED_TRACE("N=" + std::to_string(n));
    const std::string backend = n == 1 ? "nccl" : "gloo";
    for (const char* steps : {"0", "3"}) {
      const TrainResult eager = Launch(n, {"cuda", backend, "f32", "0", steps, "-", "-", "eager"});
      const TrainResult deferred =
          Launch(n, {"cuda", backend, "f32", "0", steps, "-", "-", "deferred"});
      EXPECT_EQ(deferred.losses, eager.losses);
      ASSERT_EQ(deferred.params.size(), eager.params.size());
      for (size_t i = 0; i < eager.params.size(); ++i) {
        EXPECT_TRUE(deferred.params[i].equal(eager.params[i]))
            << steps << " steps, parameter " << i;
      }
    }
  }
}

// Background saves from the GPU (staged through pinned host memory): the
// step taken while the files are written does not reach them; they hold
// the parameters of the save's step, bit for bit, and load on the CPU.
TEST(Gpu, BackgroundSavesFromTheGpuHoldTheirStep) {
  const std::string dir = ::testing::TempDir() + "/gpu_async";
  const TrainResult at_save = Launch(2, {"cuda", "gloo", "f32", "0", "2", "-", "-"});
  for (const char* kind : {"async", "async-full"}) {
    SCOPED_TRACE(kind);
    const std::string path = dir + "/" + kind;
    const TrainResult went_on =
        Launch(2, {"cuda", "gloo", "f32", "0", "2", std::string(kind) + ":" + path, "-"});
    const TrainResult loaded = Launch(1, {"cpu", "gloo", "f32", "0", "0", "-", path});
    ASSERT_EQ(loaded.params.size(), at_save.params.size());
    ASSERT_EQ(went_on.params.size(), at_save.params.size());
    bool moved = false;
    for (size_t i = 0; i < at_save.params.size(); ++i) {
      EXPECT_TRUE(loaded.params[i].equal(at_save.params[i])) << "parameter " << i;
      moved = moved || !went_on.params[i].equal(at_save.params[i]);
    }
    EXPECT_TRUE(moved) << "the step after the save changed the parameters";
  }
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) {
  bool worker = false;
  for (int i = 1; i < argc; ++i) worker = worker || std::strcmp(argv[i], "--fsdp2_worker") == 0;
  if (!worker && !torch::cuda::is_available()) {
    if (fsdp2::testing::RequireGpu()) {  // also in a dry run: the GPU check asked for one
      std::fprintf(stderr, "FAILED: gpu_test: FSDP2_REQUIRE_GPU=1, but no CUDA device is visible "
                           "(none is present, CUDA failed to initialise, or this LibTorch has no "
                           "CUDA): its cases cannot run\n");
      return 1;
    }
    if (!fsdp2::testing::DryRun()) {
#ifdef FSDP2_WITH_CUDA
      std::printf("SKIPPED: gpu_test: no CUDA device is visible\n");
#else
      std::printf("SKIPPED: gpu_test: this LibTorch has no CUDA\n");
#endif
      return 0;
    }
  }
  return fsdp2::testing::TestMain(argc, argv);
}
