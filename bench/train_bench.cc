// fsdp2/bench/train_bench.cc
//
// Training speed of the FSDP2 engine, side by side in one run, on the main
// job's GPT (examples/train_gpt.cc defaults: 4 layers, n_embd 128, 4 heads,
// 64 tokens, vocabulary 256, AdamW, clipping at 1.0) with one global batch
// (16 sequences) for every configuration:
//
//   single          one process, the model trained without the engine
//   engine N=1      one process through fully_shard (the engine's overhead)
//   FULL_SHARD, SHARD_GRAD_OP, NO_SHARD (the DDP equivalent) at N = 2, 4
//
// For each: median step time (the slowest rank's, per step), tokens/s, the
// time the training thread was blocked on collectives that compute did not
// hide (per unit and in total) and spent on copy-in, and step time against
// an ideal computed from this machine's measured GEMM throughput
// (6 x matmul parameters x tokens + attention FLOPs, at the GEMM rate of all
// cores). Configurations run in fresh processes, interleaved over --rounds so
// that a load change on the machine hits all of them alike.
//
//   bazel run //bench:train -- --quick 1     # about a minute
//   bazel run //bench:train                  # the full run
//
// With --python-ddp 1 (or auto when python3 can import torch) it also runs
// bench/python_ddp_gpt.py, PyTorch's own DDP on gloo, on the same model and
// global batch, and prints its tokens/s beside the engine's.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/train_rank.h"
#include "core/fsdp/fully_shard.h"
#include "core/launch/local_launcher.h"
#include "examples/flags/flags.h"

namespace fsdp2 {
namespace bench {
namespace {

const char* kUsage =
    "usage: bazel run -c opt //bench:train -- [--flag value ...]\n"
    "Training speed of the engine against one process and PyTorch's DDP.\n";

// The main job's GPT (examples/train_gpt.cc's defaults) and batch.
ModelFlags MainJobModel() {
  ModelFlags m;
  m.config.n_layer = 4;
  m.config.n_embd = 128;
  m.config.n_head = 4;
  m.config.block_size = 64;
  m.config.vocab_size = 256;
  m.global_batch = 16;
  return m;
}

// --------------------------------------------------------------- parent

// One unit's waits from a rank's "unit" results, in seconds per step.
struct UnitWaits {
  std::string name;
  double all_gather = 0, reduce = 0, copy_in = 0;
};

std::vector<UnitWaits> UnitWaitsOf(const Results& results) {
  std::vector<UnitWaits> units;
  auto range = results.equal_range("unit");
  for (auto it = range.first; it != range.second; ++it) {
    std::istringstream line(it->second);
    UnitWaits u;
    line >> u.name >> u.all_gather >> u.reduce >> u.copy_in;
    units.push_back(u);
  }
  return units;
}

struct Run {
  std::string label, strategy;
  int nproc;
  int threads;  // per rank
  std::vector<double> step_s;
  Results last;  // the last round's results (waits, breakdown)
};

int RunParent(flags::Flags& flags, const std::string& self) {
  const bool quick = flags.Int("quick", 0, "1: fewer steps and rounds (about 2 minutes)") != 0;
  const ModelFlags m = ReadModelFlags(flags, MainJobModel());
  const int steps = flags.Int("steps", quick ? 8 : 30, "timed steps per round");
  const int warmup = flags.Int("warmup", quick ? 2 : 5, "untimed steps first");
  const int rounds = flags.Int("rounds", quick ? 1 : 3, "rounds over all configurations");
  const std::vector<int64_t> nprocs = flags.IntList("nprocs", {2, 4}, "rank counts");
  const std::string python_ddp =
      flags.String("python-ddp", "auto", "1|0|auto: also run PyTorch's DDP");
  flags.Finish();
  const int cores = Cores();
  const models::GPTConfig& config = m.config;
  const int64_t tokens = m.global_batch * config.block_size;
  const double flops = StepFlops(config, tokens);

  std::printf("train bench: %s, AdamW + clip 1.0, fp32\n", config.ToString().c_str());
  std::printf("global batch %lld x %lld tokens = %lld tokens/step; %.3f GFLOP/step; "
              "%d cores; %d+%d steps x %d rounds; load %s\n",
              (long long)m.global_batch, (long long)config.block_size,
              (long long)tokens, flops / 1e9, cores, warmup, steps, rounds,
              LoadAverage().c_str());
  std::fflush(stdout);

  const double gemm_all =
      Value(RunConfiguration(self, 1, cores, {"--role", "gemm"}), "gemm_gflops");
  const double gemm_one =
      Value(RunConfiguration(self, 1, 1, {"--role", "gemm"}), "gemm_gflops");
  const double ideal_s = flops / (gemm_all * 1e9);
  std::printf("GEMM 2048^3 fp32: %.1f GFLOP/s on %d threads, %.1f on 1 thread; "
              "ideal step = %.2f ms\n",
              gemm_all, cores, gemm_one, ideal_s * 1e3);

  bool want_python = python_ddp == "1";
  if (python_ddp == "auto") {
    want_python = PythonTorchAvailable();
  }
  std::string python_version;

  std::vector<Run> runs;
  runs.push_back({"single (no engine)", "single", 1, cores});
  runs.push_back({"engine N=1", "full_shard", 1, cores});
  // The engine's own overhead, without OpenMP: a team of threads on this VM
  // adds more run-to-run noise than the 3% being measured.
  if (cores > 1) {
    runs.push_back({"single, 1 thread", "single", 1, 1});
    runs.push_back({"engine N=1, 1 thread", "full_shard", 1, 1});
  }
  for (int n : nprocs) {
    const int threads = std::max(1, cores / n);
    for (const char* s : {"full_shard", "shard_grad_op", "no_shard"}) {
      runs.push_back({std::string(fsdp::ToString(fsdp::ParseShardingStrategy(s))) +
                          " N=" + std::to_string(n),
                      s, n, threads});
    }
    // PyTorch's DDP in the same rounds, so that load changes hit it alike.
    if (want_python) {
      runs.push_back({"Python DDP N=" + std::to_string(n), "python_ddp", n, threads});
    }
  }
  for (int round = 0; round < rounds; ++round) {
    for (auto& run : runs) {
      std::fprintf(stderr, "round %d/%d: %s\n", round + 1, rounds, run.label.c_str());
      if (run.strategy == "python_ddp") {
        const PythonDdpResult py =
            RunPythonDdp(m, run.nproc, run.threads, /*bf16=*/false, steps, warmup);
        if (!py.ok) throw std::runtime_error("Python DDP failed: " + py.error);
        python_version = py.torch_version;
        run.step_s.push_back(py.median_step_s);  // its median over steps (slowest rank)
        continue;
      }
      auto args = ModelArgs(m);
      for (const std::string& a :
           {std::string("--role"), std::string("train"), std::string("--strategy"),
            run.strategy, std::string("--steps"), std::to_string(steps),
            std::string("--warmup"), std::to_string(warmup)}) {
        args.push_back(a);
      }
      run.last = RunConfiguration(self, run.nproc, run.threads, args);
      for (double s : Values(run.last, "step_s")) run.step_s.push_back(s);
    }
  }

  std::printf("\n%-20s %9s %10s %10s %9s %9s %9s %10s %10s %9s\n", "configuration",
              "ranks x thr", "step ms", "tokens/s", "fwd ms", "bwd ms", "opt ms",
              "exposed ms", "copy-in ms", "step/ideal");
  auto median_of = [&](const std::string& label) {
    for (const auto& r : runs) {
      if (r.label == label) return Median(r.step_s);
    }
    return 0.0;
  };
  for (const auto& r : runs) {
    const double step = Median(r.step_s);
    double exposed = 0, copy = 0;
    for (const auto& u : UnitWaitsOf(r.last)) {
      exposed += u.all_gather + u.reduce;
      copy += u.copy_in;
    }
    std::printf("%-20s %5d x %-3d %10.2f %10.0f %9.2f %9.2f %9.2f %10.2f %10.2f %9.1f\n",
                r.label.c_str(), r.nproc, r.threads, step * 1e3, tokens / step,
                Value(r.last, "forward_s") * 1e3, Value(r.last, "backward_s") * 1e3,
                Value(r.last, "update_s") * 1e3, exposed * 1e3, copy * 1e3,
                step / ideal_s);
  }

  std::printf("\nratios of median step times (lower is better for the first):\n");
  std::printf("  engine N=1 / single                 %.3f  (engine overhead in one process)\n",
              median_of("engine N=1") / median_of("single (no engine)"));
  if (cores > 1) {
    std::printf("  engine N=1 / single, 1 thread each  %.3f\n",
                median_of("engine N=1, 1 thread") / median_of("single, 1 thread"));
  }
  for (int n : nprocs) {
    const std::string sn = " N=" + std::to_string(n);
    std::printf("  FULL_SHARD / NO_SHARD%-14s %.3f\n", sn.c_str(),
                median_of("FULL_SHARD" + sn) / median_of("NO_SHARD" + sn));
    std::printf("  SHARD_GRAD_OP / NO_SHARD%-11s %.3f\n", sn.c_str(),
                median_of("SHARD_GRAD_OP" + sn) / median_of("NO_SHARD" + sn));
    std::printf("  NO_SHARD%-27s / single %.3f  (same global batch; >1: slower than one process)\n",
                sn.c_str(), median_of("NO_SHARD" + sn) / median_of("single (no engine)"));
  }

  for (const auto& r : runs) {
    if (r.strategy != "full_shard" || r.nproc < 2) continue;
    std::printf("\nexposed communication per unit, %s (ms per step, mean over ranks, "
                "last round):\n  %-12s %12s %12s %12s\n",
                r.label.c_str(), "unit", "all-gather", "reduce", "copy-in");
    for (const auto& u : UnitWaitsOf(r.last)) {
      std::printf("  %-12s %12.3f %12.3f %12.3f\n", u.name.c_str(), u.all_gather * 1e3,
                  u.reduce * 1e3, u.copy_in * 1e3);
    }
  }

  if (!want_python) {
    std::printf("\nPython DDP: skipped (python3 cannot import torch; "
                "bash scripts/setup.sh, or --python-ddp 0 "
                "to silence)\n");
  } else {
    std::printf("\nPyTorch's own DDP (torch %s, gloo, bench/python_ddp_gpt.py), "
                "same model, batch and rounds; tokens/s ratios (>1: the engine "
                "is faster):\n",
                python_version.c_str());
    for (int n : nprocs) {
      const std::string sn = " N=" + std::to_string(n);
      const double py = median_of("Python DDP" + sn);
      std::printf("  NO_SHARD / Python DDP%-6s %.3f    FULL_SHARD / Python DDP%-6s %.3f\n",
                  sn.c_str(), py / median_of("NO_SHARD" + sn), sn.c_str(),
                  py / median_of("FULL_SHARD" + sn));
    }
  }
  std::printf("\nload at the end: %s\n", LoadAverage().c_str());
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace fsdp2

int main(int argc, char** argv) {
  using namespace fsdp2;
  try {
    flags::Flags flags(argc, argv, bench::kUsage);
    if (!launch::IsRankProcess()) return bench::RunParent(flags, argv[0]);
    const std::string role = flags.String("role", "train", "train|gemm (rank processes)");
    if (role == "gemm") return bench::RunGemmRank(flags);
    return bench::RunTrainRank(flags, bench::MainJobModel());
  } catch (const std::exception& e) {
    std::cerr << "train bench: " << e.what() << "\n";
    return 1;
  }
}
