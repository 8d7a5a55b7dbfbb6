// fsdp2/bench/memory_bench.cc
//
// Per-rank memory of FULL_SHARD against NO_SHARD for N = 1, 2, 4 on a GPT
// large enough that parameters, gradients and AdamW state dominate (default
// 12 layers, n_embd 768, 12 heads: GPT-2 small's blocks with a 256-token
// vocabulary, 85M parameters), side by side in one run.
//
// For each configuration, the largest value over its ranks of:
//   peak RSS (train)   VmHWM over the training steps: the high-water mark is
//                      reset (/proc/self/clear_refs) once the model is sharded
//                      and the optimizer built, so the full model every rank
//                      builds before sharding is left out
//   peak RSS (process) VmHWM since the process started, that build included
//   baseline           RSS before the model was built (LibTorch, Gloo)
//   the engine's own counts: sharded params, sharded grads, optimizer state,
//   peak unsharded params (all-gathered bytes alive at once)
// and prints peak FULL_SHARD / peak NO_SHARD at each N, with and without the
// baseline.
//
// Then activation checkpointing (core/fsdp/activation_checkpoint.h): the
// same model, FULL_SHARD on --ac-nproc ranks (default 2) with
// --ac-rows-per-rank sequences (4) of --ac-block-size tokens (128), without
// and with every block checkpointed, side by side: the peaks (train and
// per phase), the median step time (wall, and the training thread's CPU
// time, which a loaded machine disturbs less), and with / without for each.
// With --ac-rounds R > 1 the pair runs R times: the peak ratio of every
// round is printed, and the largest is the one reported.
//
// Between steps the gradients are zeroed as FSDP2Strategy zeroes them
// (--zero-grad free, the default: freed, and a zero one given before the
// step to each parameter that got none; LazyZeroGrad), so the sharded
// gradients are not held through forward. --zero-grad in_place zeroes them
// in place (zero_grad(set_to_none=false), what FSDP2Strategy did
// before) and --zero-grad none sets them to none (PyTorch 2's default).
//
//   bazel run //bench:memory -- --quick 1
//   bazel run //bench:memory
//   bazel run //bench:memory -- --nprocs 2 --ac-only 1   # the AC part only
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <functional>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/comm/device_mesh.h"
#include "core/comm/world.h"
#include "core/fsdp/fully_shard.h"
#include "core/launch/local_launcher.h"
#include "core/models/gpt.h"
#include "core/models/gpt_module.h"
#include "core/strategy/lazy_zero_grad.h"
#include "examples/flags/flags.h"

namespace fsdp2 {
namespace bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

const char* kUsage =
    "usage: bazel run -c opt //bench:memory -- [--flag value ...]\n"
    "Per-rank memory of FULL_SHARD against NO_SHARD.\n";

// GPT-2 small's blocks with a 256-token vocabulary, unless flags say
// otherwise.
models::GPTConfig Config(flags::Flags& flags) {
  models::GPTConfig gpt2_small;
  gpt2_small.n_layer = 12;
  gpt2_small.n_embd = 768;
  gpt2_small.n_head = 12;
  gpt2_small.block_size = 64;
  gpt2_small.vocab_size = 256;
  return ReadGPTConfig(flags, gpt2_small);
}

// How gradients are zeroed between steps: "free", "in_place" or "none".
std::string ZeroGradMode(flags::Flags& flags) {
  const std::string mode = flags.String(
      "zero-grad", "free",
      "free (as FSDP2Strategy: freed, zero where none came), in_place or none");
  if (mode != "free" && mode != "in_place" && mode != "none") {
    throw std::invalid_argument("--zero-grad: '" + mode + "' is not free, in_place or none");
  }
  return mode;
}

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

const char* kKeys[] = {"baseline", "peak_train", "peak_process", "sharded_params",
                       "sharded_grads", "optimizer_state", "peak_unsharded",
                       "peak_forward", "peak_backward", "peak_step", "step_s",
                       "step_cpu_s"};

int RunRank(flags::Flags& flags) {
  const models::GPTConfig config = Config(flags);
  const std::string strategy = flags.String("strategy", "full_shard", "sharding strategy");
  const int64_t global_batch = flags.Int("global-batch", 4, "sequences per step, all ranks");
  const int steps = flags.Int("steps", 3, "training steps");
  const int ac = flags.Int("ac", 0, "1: checkpoint every block's activations");
  const std::string zero_grad = ZeroGradMode(flags);
  flags.Finish();
  const char* threads = std::getenv("FSDP2_THREADS");
  at::set_num_threads(threads ? std::max(1, std::atoi(threads)) : 1);

  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  const int rank = world->rank(), n = world->size();
  const int64_t baseline = ResidentBytes();

  torch::manual_seed(1337);
  models::GPTModule module(config, models::GPT2AdamW(3e-4));
  models::GPT model = module.gpt();
  fsdp::FSDPOptions options;
  options.mesh = comm::DeviceMesh::Create(world, {n}, {"dp"});
  options.strategy = fsdp::ParseShardingStrategy(strategy);
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    fsdp::fully_shard(model->block(i), options);
  }
  fsdp::fully_shard(model, options);
  if (ac == 1) {
    fsdp::apply_activation_checkpointing(*model, fsdp::ActivationCheckpointing::Full());
  }
  auto optimizer = module.configure_optimizers();
  const int64_t peak_before_training = PeakResidentBytes();
  if (!ResetPeakResidentBytes()) {
    throw std::runtime_error("cannot reset VmHWM through /proc/self/clear_refs");
  }
  fsdp::reset_peak_unsharded_param_bytes();

  const int64_t batch = std::max<int64_t>(1, global_batch / n);
  auto gen = at::detail::createCPUGenerator(7 + rank);
  at::Tensor tokens = at::randint(config.vocab_size, {batch, config.block_size + 1},
                                  gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor x = tokens.narrow(1, 0, config.block_size).contiguous();
  at::Tensor y = tokens.narrow(1, 1, config.block_size).contiguous();
  // Peak RSS of each phase of a step (the high-water mark is reset at each
  // phase's start), the largest over the steps: where the peak comes from.
  int64_t phase_peak[3] = {0, 0, 0};  // forward, backward, clip + step
  strategy::LazyZeroGrad lazy_zero;
  // Wall time, and CPU time of this (the training) thread, which a loaded
  // machine disturbs far less: the steps after the first two.
  std::vector<double> step_s, step_cpu_s;
  double this_step_s = 0, this_step_cpu_s = 0;
  auto phase = [&](int k, const std::function<void()>& fn) {
    ResetPeakResidentBytes();
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ThreadCpuSeconds();
    fn();
    this_step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    this_step_cpu_s += ThreadCpuSeconds() - cpu_start;
    phase_peak[k] = std::max(phase_peak[k], PeakResidentBytes());
  };
  for (int step = 0; step < steps; ++step) {
    if (step > 2) {  // step - 1 >= 2
      step_s.push_back(this_step_s);
      step_cpu_s.push_back(this_step_cpu_s);
    }
    this_step_s = this_step_cpu_s = 0;
    at::Tensor loss;
    phase(0, [&] {
      if (zero_grad == "free") {
        lazy_zero.zero_grad(*optimizer);
      } else if (zero_grad == "none") {
        for (at::Tensor& p : model->parameters()) p.mutable_grad() = at::Tensor();
      } else {
        optimizer->zero_grad(/*set_to_none=*/false);
      }
      loss = module.training_step({x, y}, step);
    });
    phase(1, [&] {
      loss.backward();
      loss = at::Tensor();
    });
    phase(2, [&] {
      lazy_zero.materialize();
      fsdp::clip_grad_norm_(*model, 1.0);
      optimizer->step();
    });
  }
  if (steps > 2) {
    step_s.push_back(this_step_s);
    step_cpu_s.push_back(this_step_cpu_s);
  }

  const auto stats = fsdp::memory_stats(*model);
  int64_t optimizer_bytes = 0;
  for (const auto& kv : optimizer->state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*kv.second);
    optimizer_bytes += s.exp_avg().nbytes() + s.exp_avg_sq().nbytes();
    if (s.max_exp_avg_sq().defined()) optimizer_bytes += s.max_exp_avg_sq().nbytes();
  }
  const int64_t peak_train =
      std::max({phase_peak[0], phase_peak[1], phase_peak[2]});
  std::vector<double> values = {
      double(baseline), double(peak_train),
      double(std::max(peak_before_training, peak_train)),
      double(stats.sharded_param_bytes), double(stats.sharded_grad_bytes),
      double(optimizer_bytes), double(fsdp::peak_unsharded_param_bytes()),
      double(phase_peak[0]), double(phase_peak[1]), double(phase_peak[2])};
  // Per step, the slowest rank's times; their medians.
  for (const auto* v : {&step_s, &step_cpu_s}) {
    at::Tensor times = at::tensor(v->empty() ? std::vector<double>{0} : *v, at::kDouble);
    world->group()->all_reduce(times, comm::ReduceOp::kMax).wait();
    values.push_back(Median(std::vector<double>(times.data_ptr<double>(),
                                                times.data_ptr<double>() + times.numel())));
  }
  at::Tensor t = at::tensor(values, at::kDouble);
  world->group()->all_reduce(t, comm::ReduceOp::kMax).wait();
  if (rank == 0) {
    for (size_t i = 0; i < values.size(); ++i) WriteResult(kKeys[i], t[i].item<double>());
    WriteResult("params", double(stats.total_param_numel));
  }
  return 0;
}

void RunShardingTable(const models::GPTConfig& config, const std::vector<int64_t>& nprocs,
                      int steps, int64_t global_batch, int cores, const std::string& self,
                      const std::vector<std::string>& common);
void RunCheckpointingTable(const models::GPTConfig& config, int nproc, int64_t rows,
                           int steps, int rounds, int cores, const std::string& self,
                           const std::vector<std::string>& common);

int RunParent(flags::Flags& flags, const std::string& self) {
  const bool quick = flags.Int("quick", 0, "1: fewer steps") != 0;
  const int steps = flags.Int("steps", quick ? 2 : 4, "training steps");
  const int64_t global_batch = flags.Int("global-batch", 4, "sequences per step, all ranks");
  const models::GPTConfig config = Config(flags);
  const std::vector<int64_t> nprocs = flags.IntList("nprocs", {1, 2, 4}, "rank counts");
  const int ac_nproc = flags.Int("ac-nproc", 2, "activation checkpointing: ranks (0: skip)");
  const int64_t ac_rows = flags.Int("ac-rows-per-rank", 4, "activation checkpointing: rows");
  const int64_t ac_block = flags.Int("ac-block-size", 128, "activation checkpointing: tokens");
  const int ac_steps = flags.Int("ac-steps", quick ? 4 : 6, "activation checkpointing: steps");
  const bool ac_only = flags.Int("ac-only", 0, "1: only the activation checkpointing part") != 0;
  const int ac_rounds = flags.Int("ac-rounds", 1, "activation checkpointing: rounds (time: median)");
  const std::string zero_grad = ZeroGradMode(flags);
  flags.Finish();
  const int cores = Cores();
  const std::vector<std::string> common = {"--zero-grad", zero_grad};
  std::printf("gradients between steps (--zero-grad): %s\n",
              zero_grad == "free"       ? "free, a zero one before the step where none came "
                                          "(as FSDP2Strategy does)"
              : zero_grad == "in_place" ? "zeroed in place (zero_grad(set_to_none=false))"
                                        : "set to none (PyTorch 2's default zero_grad())");
  if (!ac_only) RunShardingTable(config, nprocs, steps, global_batch, cores, self, common);
  if (ac_nproc > 0) {
    models::GPTConfig ac_config = config;
    ac_config.block_size = ac_block;
    RunCheckpointingTable(ac_config, ac_nproc, ac_rows, ac_steps, std::max(1, ac_rounds),
                          cores, self, common);
  }
  std::printf("\nload at the end: %s\n", LoadAverage().c_str());
  return 0;
}

// FULL_SHARD against NO_SHARD at each N.
void RunShardingTable(const models::GPTConfig& config, const std::vector<int64_t>& nprocs,
                      int steps, int64_t global_batch, int cores, const std::string& self,
                      const std::vector<std::string>& common) {
  std::printf("memory bench: GPT n_layer %lld n_embd %lld n_head %lld block %lld vocab %lld; "
              "AdamW fp32; global batch %lld; %d steps; load %s\n",
              (long long)config.n_layer, (long long)config.n_embd, (long long)config.n_head,
              (long long)config.block_size, (long long)config.vocab_size,
              (long long)global_batch, steps, LoadAverage().c_str());
  std::printf("(MiB per rank, the largest over ranks; peak train is the largest of "
              "the peaks in forward, backward and clip + optimizer step)\n\n"
              "%-16s %9s %10s %12s %9s %9s %9s %10s %8s %8s %8s %10s\n",
              "configuration", "baseline", "peak train", "peak process", "params",
              "grads", "optimizer", "unsharded", "fwd", "bwd", "step", "params #");
  std::fflush(stdout);
  std::map<std::string, Results> results;
  for (int n : nprocs) {
    for (const char* strategy : {"full_shard", "no_shard"}) {
      if (n == 1 && std::string(strategy) == "no_shard") continue;  // the same
      std::vector<std::string> args = {"--strategy", strategy, "--steps", std::to_string(steps),
                                       "--global-batch", std::to_string(global_batch)};
      for (const auto& a : GPTConfigArgs(config)) args.push_back(a);
      args.insert(args.end(), common.begin(), common.end());
      Results r = RunConfiguration(self, n, std::max(1, cores / n), args);
      const std::string label = std::string(fsdp::ToString(
                                    fsdp::ParseShardingStrategy(strategy))) +
                                " N=" + std::to_string(n);
      std::printf("%-16s %9.1f %10.1f %12.1f %9.1f %9.1f %9.1f %10.1f %8.1f %8.1f %8.1f "
                  "%10.0f\n",
                  label.c_str(), Value(r, "baseline") / kMiB,
                  Value(r, "peak_train") / kMiB, Value(r, "peak_process") / kMiB,
                  Value(r, "sharded_params") / kMiB, Value(r, "sharded_grads") / kMiB,
                  Value(r, "optimizer_state") / kMiB, Value(r, "peak_unsharded") / kMiB,
                  Value(r, "peak_forward") / kMiB, Value(r, "peak_backward") / kMiB,
                  Value(r, "peak_step") / kMiB, Value(r, "params"));
      std::fflush(stdout);
      results[label] = r;
    }
  }
  std::printf("\npeak FULL_SHARD / peak NO_SHARD per rank:\n");
  for (int n : nprocs) {
    if (n == 1) continue;
    const auto& fs = results["FULL_SHARD N=" + std::to_string(n)];
    const auto& ns = results["NO_SHARD N=" + std::to_string(n)];
    auto ratio = [&](const char* key, bool minus_baseline) {
      const double a = Value(fs, key) - (minus_baseline ? Value(fs, "baseline") : 0);
      const double b = Value(ns, key) - (minus_baseline ? Value(ns, "baseline") : 0);
      return a / b;
    };
    std::printf("  N=%d  training peak %.3f (above baseline %.3f); process peak %.3f "
                "(above baseline %.3f)\n",
                n, ratio("peak_train", false), ratio("peak_train", true),
                ratio("peak_process", false), ratio("peak_process", true));
  }
}

// FULL_SHARD on `nproc` ranks without and with every block checkpointed,
// alternating for `rounds` rounds (so that load changes hit both alike):
// each round's peaks and step time, then the median step time of each and
// the ratios. The peaks differ between rounds by up to a unit buffer (the
// allocator's page heap may grow when a buffer finds no free span of its
// size), so each round's peak ratio is printed and the largest reported.
void RunCheckpointingTable(const models::GPTConfig& config, int nproc, int64_t rows,
                           int steps, int rounds, int cores, const std::string& self,
                           const std::vector<std::string>& common) {
  std::printf("\nactivation checkpointing: GPT n_layer %lld n_embd %lld, FULL_SHARD N=%d, "
              "%lld rows x %lld tokens per rank, fp32 AdamW, %d steps, %d round(s) (step "
              "time: median of the steps after the first two, slowest rank); load %s\n"
              "%-18s %10s %8s %8s %8s %9s %10s %10s\n",
              (long long)config.n_layer, (long long)config.n_embd, nproc, (long long)rows,
              (long long)config.block_size, steps, rounds, LoadAverage().c_str(),
              "configuration", "peak train", "fwd", "bwd", "step", "baseline", "step time",
              "cpu time");
  std::fflush(stdout);
  std::vector<Results> runs[2];
  std::vector<double> times[2], cpu[2];
  for (int round = 0; round < rounds; ++round) {
    for (int ac : {0, 1}) {
      std::vector<std::string> args = {"--strategy", "full_shard", "--steps",
                                       std::to_string(steps), "--global-batch",
                                       std::to_string(rows * nproc), "--ac", std::to_string(ac)};
      for (const auto& a : GPTConfigArgs(config)) args.push_back(a);
      args.insert(args.end(), common.begin(), common.end());
      Results r = RunConfiguration(self, nproc, std::max(1, cores / nproc), args);
      runs[ac].push_back(r);
      times[ac].push_back(Value(r, "step_s"));
      cpu[ac].push_back(Value(r, "step_cpu_s"));
      std::printf("%-18s %10.1f %8.1f %8.1f %8.1f %9.1f %8.3f s %8.3f s\n",
                  ac ? "AC full" : "no AC", Value(r, "peak_train") / kMiB,
                  Value(r, "peak_forward") / kMiB, Value(r, "peak_backward") / kMiB,
                  Value(r, "peak_step") / kMiB, Value(r, "baseline") / kMiB,
                  Value(r, "step_s"), Value(r, "step_cpu_s"));
      std::fflush(stdout);
    }
  }
  // The round with the largest peak ratio stands for all.
  auto round_ratio = [&](size_t round, const char* key, bool minus_baseline) {
    const Results& with = runs[1][round];
    const Results& without = runs[0][round];
    const double a = Value(with, key) - (minus_baseline ? Value(with, "baseline") : 0);
    const double b = Value(without, key) - (minus_baseline ? Value(without, "baseline") : 0);
    return a / b;
  };
  size_t worst = 0;
  if (rounds > 1) std::printf("  peak train with / without, by round:");
  for (size_t round = 0; round < runs[1].size(); ++round) {
    const double r = round_ratio(round, "peak_train", false);
    if (rounds > 1) std::printf(" %.3f", r);
    if (r > round_ratio(worst, "peak_train", false)) worst = round;
  }
  if (rounds > 1) std::printf(" (the largest, round %zu, below)\n", worst + 1);
  auto ratio = [&](const char* key, bool minus_baseline) {
    return round_ratio(worst, key, minus_baseline);
  };
  std::printf("  with / without: peak train %.3f (above baseline %.3f), backward peak %.3f; "
              "median step time %.3f s / %.3f s = %.3f; training thread's CPU time %.3f s / "
              "%.3f s = %.3f\n",
              ratio("peak_train", false), ratio("peak_train", true),
              ratio("peak_backward", false), Median(times[1]), Median(times[0]),
              Median(times[1]) / Median(times[0]), Median(cpu[1]), Median(cpu[0]),
              Median(cpu[1]) / Median(cpu[0]));
}

}  // namespace
}  // namespace bench
}  // namespace fsdp2

int main(int argc, char** argv) {
  using namespace fsdp2;
  try {
    flags::Flags flags(argc, argv, bench::kUsage);
    if (!launch::IsRankProcess()) return bench::RunParent(flags, argv[0]);
    return bench::RunRank(flags);
  } catch (const std::exception& e) {
    std::cerr << "memory bench: " << e.what() << "\n";
    return 1;
  }
}
