// fsdp2/bench/matrix_bench.cc
//
// The benchmark matrix: the engine as shipped (the launcher's defaults,
// allocator included) against PyTorch's own DDP on the same model and batch,
// measured side by side in one run, over
//
//   models      3.3M  4 layers x 256, 4 heads, vocab 512, T 128, 8 rows/rank
//               85M   12 layers x 768, 12 heads, vocab 256, T 128, 2 rows/rank
//   precision   fp32, and bf16 (engine: bf16 all-gather and compute, fp32
//               master shards and reduction; PyTorch: CPU bf16 autocast)
//   ranks       N = 1, 2, 4 (threads per rank: cores / N, at least 1)
//   strategies  FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, and PyTorch DDP; for
//               N > 1 also PyTorch with no communication at all (each rank
//               trains its slice alone): the fastest any data-parallel step
//               built from PyTorch's kernels can run on these cores, so its
//               tokens/s over DDP's is the ceiling of engine / DDP for an
//               engine whose model kernels are PyTorch's
//
// Per configuration: median step time (slowest rank), tokens/s, peak RSS per
// rank (training; the process's own peak beside it), exposed communication
// per step, and tokens/s against PyTorch DDP's. Then the ratios docs/benchmarks.md
// quotes. Rows per rank stay fixed, so the global batch grows with N.
//
//   bazel run //bench:matrix -- --quick 1      # about 15 minutes on 2 cores
//   bazel run //bench:matrix -- --models 3m --precisions fp32 --nprocs 2
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/isa_peak.h"
#include "bench/ratio_chart.h"
#include "bench/train_rank.h"
#include "core/launch/allocator.h"
#include "core/launch/local_launcher.h"
#include "core/strategy/fsdp2_strategy.h"
#include "examples/flags/flags.h"

namespace fsdp2 {
namespace bench {
namespace {

const char* kUsage =
    "usage: bazel run //bench:matrix -- [--flag value ...]\n"
    "The engine as shipped against PyTorch DDP: models x precisions x ranks x "
    "strategies.\n";

struct Model {
  std::string name;
  models::GPTConfig config;
  int64_t rows_per_rank;
};

std::vector<Model> AllModels() {
  Model small{"3m", {}, 8};
  small.config.n_layer = 4;
  small.config.n_embd = 256;
  small.config.n_head = 4;
  small.config.block_size = 128;
  small.config.vocab_size = 512;
  Model large{"85m", Gpt85M(), 2};
  return {small, large};
}

// "bf16 compute": what the CPU offers for it (oneDNN uses AVX512-BF16 or AMX
// when present, else converts to fp32).
std::string Bf16Support() {
  const std::string flags = launch::CpuFlags();
  std::string s;
  for (const char* f : {"avx512f", "avx512_bf16", "amx_bf16"}) {
    if (launch::HasCpuFlag(flags, f)) {
      s += s.empty() ? f : std::string(", ") + f;
    }
  }
  return s.empty() ? "no AVX-512" : s;
}

// The PyTorch rows: DDP, the same ranks with no communication, and
// PyTorch's own FSDP2.
const char kDdp[] = "ddp";
const char kNoComm[] = "torch_no_comm";
const char kTorchFsdp2[] = "torch_fsdp2";

bool IsPyTorch(const std::string& strategy) {
  return strategy == kDdp || strategy == kNoComm || strategy == kTorchFsdp2;
}

struct Cell {
  std::string model, precision, strategy;  // IsPyTorch(): PyTorch
  int nproc = 0, threads = 0;
  int64_t tokens = 0;  // per step, all ranks
  std::vector<double> step_s;
  std::vector<double> round_step_s;  // the median step of each round
  double peak_rss_mib = 0, peak_process_mib = 0, exposed_s = 0;
};

double Step(const Cell& c) { return Median(c.step_s); }
double TokensPerS(const Cell& c) { return c.tokens / Step(c); }

// a's speed over b's (tokens/s when `tokens`, else step time a / b) in each
// round: the machine's speed drifts over minutes (one core's SGEMM measured
// 103 to 137 GFLOP/s a second apart), and two cells of one round ran
// seconds apart.
std::vector<double> RoundRatios(const Cell& a, const Cell& b, bool tokens) {
  std::vector<double> ratios;
  for (size_t i = 0; i < a.round_step_s.size() && i < b.round_step_s.size(); ++i) {
    const double ta = a.round_step_s[i], tb = b.round_step_s[i];
    ratios.push_back(tokens ? (a.tokens / ta) / (b.tokens / tb) : ta / tb);
  }
  return ratios;
}

int RunParent(flags::Flags& flags, const std::string& self) {
  const bool quick = flags.Int("quick", 0, "1: fewer steps, one round") != 0;
  const std::vector<std::string> model_names =
      flags.StringList("models", {"3m", "85m"}, "models: 3m, 85m");
  const std::vector<std::string> precisions =
      flags.StringList("precisions", {"fp32", "bf16"}, "fp32, bf16");
  const std::vector<int64_t> nprocs = flags.IntList("nprocs", {1, 2, 4}, "rank counts");
  const std::vector<std::string> strategies = flags.StringList(
      "strategies", {"full_shard", "shard_grad_op", "no_shard"}, "engine strategies");
  const int steps = flags.Int("steps", quick ? 4 : 10, "timed steps per configuration");
  const int warmup = flags.Int("warmup", 2, "untimed steps first");
  const int rounds = flags.Int("rounds", quick ? 1 : 2, "rounds over all configurations");
  const std::string python_ddp =
      flags.String("python-ddp", "auto", "1|0|auto: also run PyTorch's DDP");
  const bool no_comm = flags.Int("torch-no-comm", 1,
                                 "1: also PyTorch without communication (N > 1), "
                                 "the ceiling of engine / DDP") != 0;
  const bool torch_fsdp2 = flags.Int("torch-fsdp2", 1,
                                     "1: also PyTorch's own FSDP2 (fully_shard, gloo)") != 0;
  const std::string svg = flags.String(
      "svg", "", "also write the comparisons with PyTorch as an SVG bar chart to this file");
  flags.Finish();
  const int cores = Cores();
  bool want_python = python_ddp == "1" || (python_ddp == "auto" && PythonTorchAvailable());

  std::vector<Model> chosen;
  for (const Model& m : AllModels()) {
    if (std::find(model_names.begin(), model_names.end(), m.name) != model_names.end()) {
      chosen.push_back(m);
    }
  }
  if (chosen.size() != model_names.size()) {
    throw std::invalid_argument("--models: each must be 3m or 85m");
  }
  for (const auto& p : precisions) {
    if (p != "fp32" && p != "bf16") throw std::invalid_argument("--precisions: fp32 or bf16");
  }
  std::printf("matrix bench: the engine as shipped (allocator %s) against PyTorch DDP; "
              "%d cores (bf16: %s); %d+%d steps x %d rounds; load %s\n",
              launch::RequestedAllocator().c_str(), cores, Bf16Support().c_str(), warmup,
              steps, rounds, LoadAverage().c_str());
  // What bf16 can gain at most on this core, measured (without AMX, which
  // oneDNN would use instead and this does not measure).
  const IsaPeak peak = MeasureIsaPeak(launch::CpuFlags());
  std::printf("one core's peak: %s\n", DescribeIsaPeak(peak).c_str());
  std::fflush(stdout);

  std::vector<Cell> cells;
  for (const Model& m : chosen) {
    for (const auto& p : precisions) {
      for (int64_t n : nprocs) {
        std::vector<std::string> kinds = strategies;
        if (want_python) kinds.push_back(kDdp);
        if (want_python && no_comm && n > 1) kinds.push_back(kNoComm);
        if (want_python && torch_fsdp2) kinds.push_back(kTorchFsdp2);
        for (const auto& s : kinds) {
          Cell c;
          c.model = m.name;
          c.precision = p;
          c.strategy = s;
          c.nproc = static_cast<int>(n);
          c.threads = std::max(1, cores / c.nproc);
          c.tokens = m.rows_per_rank * n * m.config.block_size;
          cells.push_back(c);
        }
      }
    }
  }
  auto model_of = [&](const Cell& c) {
    for (const Model& m : chosen) {
      if (m.name == c.model) {
        ModelFlags f;
        f.config = m.config;
        f.global_batch = m.rows_per_rank * c.nproc;
        return f;
      }
    }
    throw std::logic_error("unknown model " + c.model);
  };
  std::string torch_version;
  for (int round = 0; round < rounds; ++round) {
    for (Cell& c : cells) {
      std::fprintf(stderr, "round %d/%d: %s %s N=%d %s\n", round + 1, rounds,
                   c.model.c_str(), c.precision.c_str(), c.nproc, c.strategy.c_str());
      const ModelFlags m = model_of(c);
      if (IsPyTorch(c.strategy)) {
        const PythonDdpResult py = RunPythonDdp(
            m, c.nproc, c.threads, c.precision == "bf16", steps, warmup,
            c.strategy == kNoComm      ? PythonMode::kNoComm
            : c.strategy == kTorchFsdp2 ? PythonMode::kFsdp2
                                        : PythonMode::kDdp);
        if (!py.ok) {
          throw std::runtime_error("Python " + c.strategy + " failed: " + py.error);
        }
        torch_version = py.torch_version;
        c.step_s.push_back(py.median_step_s);
        c.round_step_s.push_back(py.median_step_s);
        c.peak_process_mib = std::max(c.peak_process_mib, py.peak_rss_mib);
        continue;
      }
      std::vector<std::string> args = ModelArgs(m);
      for (const std::string& a :
           {std::string("--role"), std::string("train"), std::string("--strategy"),
            c.strategy, std::string("--mixed-precision"), c.precision,
            std::string("--steps"), std::to_string(steps), std::string("--warmup"),
            std::to_string(warmup)}) {
        args.push_back(a);
      }
      const Results r = RunConfiguration(self, c.nproc, c.threads, args);
      for (double s : Values(r, "step_s")) c.step_s.push_back(s);
      c.round_step_s.push_back(Median(Values(r, "step_s")));
      c.peak_rss_mib = std::max(c.peak_rss_mib, Value(r, "peak_rss_mib"));
      c.peak_process_mib = std::max(c.peak_process_mib, Value(r, "peak_process_mib"));
      double exposed = 0;
      auto range = r.equal_range("unit");
      for (auto it = range.first; it != range.second; ++it) {
        std::string name;
        double all_gather = 0, reduce = 0;
        std::istringstream(it->second) >> name >> all_gather >> reduce;
        exposed += all_gather + reduce;
      }
      c.exposed_s = exposed;
    }
  }

  auto find = [&](const std::string& model, const std::string& precision, int n,
                  const std::string& strategy) -> const Cell* {
    for (const Cell& c : cells) {
      if (c.model == model && c.precision == precision && c.nproc == n &&
          c.strategy == strategy && !c.step_s.empty()) {
        return &c;
      }
    }
    return nullptr;
  };
  for (const Model& m : chosen) {
    for (const auto& p : precisions) {
      std::printf("\n%s (%s), %s, %lld rows x %lld tokens per rank\n", m.name.c_str(),
                  m.config.ToString().c_str(), p.c_str(), (long long)m.rows_per_rank,
                  (long long)m.config.block_size);
      std::printf("  %-14s %-9s %9s %10s %12s %12s %11s %9s %9s\n", "strategy",
                  "ranks x thr", "step ms", "tokens/s", "peak MiB/rk", "process MiB",
                  "exposed ms", "vs DDP", "vs fp32");
      for (int64_t n : nprocs) {
        const Cell* ddp = find(m.name, p, n, kDdp);
        for (const Cell& c : cells) {
          if (c.model != m.name || c.precision != p || c.nproc != n || c.step_s.empty()) {
            continue;
          }
          const bool engine = !IsPyTorch(c.strategy);
          const Cell* fp32 = find(m.name, "fp32", c.nproc, c.strategy);
          std::printf("  %-14s %5d x %-3d %9.1f %10.0f ", c.strategy.c_str(), c.nproc,
                      c.threads, Step(c) * 1e3, TokensPerS(c));
          if (engine) {
            std::printf("%12.0f %12.0f %11.1f ", c.peak_rss_mib, c.peak_process_mib,
                        c.exposed_s * 1e3);
          } else {
            std::printf("%12s %12.0f %11s ", "-", c.peak_process_mib, "-");
          }
          if (c.strategy != kDdp && ddp) {
            std::printf("%9.2f ", TokensPerS(c) / TokensPerS(*ddp));
          } else {
            std::printf("%9s ", "-");
          }
          if (p != "fp32" && fp32) {
            std::printf("%9.2f", TokensPerS(c) / TokensPerS(*fp32));
          } else {
            std::printf("%9s", "-");
          }
          std::printf("\n");
        }
      }
    }
  }

  std::printf("\nratios (vs DDP: tokens/s, >1 the engine is faster; memory: peak RSS "
              "per rank of training)\n");
  // `note` in brackets after the ratio: its target, or what it bounds.
  auto ratio_line = [&](const std::string& what, const Cell* a, const Cell* b,
                        bool tokens, const std::string& note) {
    if (!a || !b) return;
    const double r = tokens ? TokensPerS(*a) / TokensPerS(*b)
                            : Step(*a) / Step(*b);
    std::vector<double> rounds = RoundRatios(*a, *b, tokens);
    std::string paired;
    if (rounds.size() > 1) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "   [by round: median %.2f, %.2f to %.2f]",
                    Median(rounds), *std::min_element(rounds.begin(), rounds.end()),
                    *std::max_element(rounds.begin(), rounds.end()));
      paired = buf;
    }
    std::printf("  %-52s %6.2f   (%s)%s\n", what.c_str(), r, note.c_str(),
                paired.c_str());
  };
  auto memory_line = [&](const char* what, const Cell* a, const Cell* b,
                         const char* target) {
    if (!a || !b) return;
    std::printf("  %-52s %6.2f   (target %s)\n", what, a->peak_rss_mib / b->peak_rss_mib,
                target);
  };
  // Against PyTorch's own FSDP2 and the ceiling, per model: tokens/s, and
  // each process's peak RSS (the engine's ranks and PyTorch's alike, as the
  // kernel counts it).
  const std::vector<std::pair<std::string, std::string>> fsdp2_targets = {
      {"3m", "1.05"}, {"85m", "1.2"}};
  // The chart: each model's N = 2 FULL_SHARD against PyTorch, > 1 where
  // fsdp2 is faster or smaller.
  std::vector<ChartBar> bars;
  for (const auto& [model, target] : fsdp2_targets) {
    const std::string name = model == "3m" ? "3.3M" : "85M";
    const Cell* ours = find(model, "fp32", 2, "full_shard");
    const Cell* theirs = find(model, "fp32", 2, kTorchFsdp2);
    if (ours) {
      const std::string group = name + " GPT, fp32, 2 ranks, FULL_SHARD";
      auto speed = [&](const char* label, const Cell* other) {
        if (other) bars.push_back({group, label, TokensPerS(*ours) / TokensPerS(*other)});
      };
      speed("tokens/s / PyTorch FSDP2's", theirs);
      speed("tokens/s / PyTorch DDP's", find(model, "fp32", 2, kDdp));
      speed("tokens/s / PyTorch without communication", find(model, "fp32", 2, kNoComm));
      if (theirs) {
        bars.push_back({group, "PyTorch FSDP2's peak RSS / fsdp2's",
                        theirs->peak_process_mib / ours->peak_process_mib});
      }
    }
    ratio_line(name + " fp32 N=2 FULL_SHARD / PyTorch FSDP2 tokens/s", ours, theirs, true,
               "target >= " + target);
    ratio_line(name + " fp32 N=2 FULL_SHARD / PyTorch no comm tokens/s", ours,
               find(model, "fp32", 2, kNoComm), true, "target >= 0.97");
    if (ours && theirs) {
      std::printf("  %-52s %6.2f   (target <= 1)\n",
                  (name + " fp32 N=2 peak RSS FULL_SHARD / PyTorch FSDP2").c_str(),
                  ours->peak_process_mib / theirs->peak_process_mib);
    }
  }
  const std::string ceiling =
      "ceiling of engine / DDP with PyTorch's kernels: no communication at all";
  ratio_line("3.3M fp32 N=2 FULL_SHARD / PyTorch DDP tokens/s",
             find("3m", "fp32", 2, "full_shard"), find("3m", "fp32", 2, kDdp), true,
             "target >= 1.2");
  ratio_line("3.3M fp32 N=2 PyTorch no comm / PyTorch DDP tokens/s",
             find("3m", "fp32", 2, kNoComm), find("3m", "fp32", 2, kDdp), true, ceiling);
  ratio_line("3.3M fp32 N=2 FULL_SHARD / NO_SHARD step time",
             find("3m", "fp32", 2, "full_shard"), find("3m", "fp32", 2, "no_shard"), false,
             "target <= 1.10");
  ratio_line("85M fp32 N=2 FULL_SHARD / PyTorch DDP tokens/s",
             find("85m", "fp32", 2, "full_shard"), find("85m", "fp32", 2, kDdp), true,
             "target >= 2");
  ratio_line("85M fp32 N=2 PyTorch no comm / PyTorch DDP tokens/s",
             find("85m", "fp32", 2, kNoComm), find("85m", "fp32", 2, kDdp), true,
             ceiling);
  memory_line("85M fp32 N=2 peak RSS FULL_SHARD / NO_SHARD",
              find("85m", "fp32", 2, "full_shard"), find("85m", "fp32", 2, "no_shard"),
              "<= 0.60");
  memory_line("85M fp32 N=4 peak RSS FULL_SHARD / NO_SHARD",
              find("85m", "fp32", 4, "full_shard"), find("85m", "fp32", 4, "no_shard"),
              "<= 0.40");
  // The bf16 target is for CPUs whose bf16 is faster than their fp32; on
  // the others (see strategy::LowPrecisionSpeedOn) it says so.
  std::string bf16_target = "target >= 1.8 with AVX512-BF16";
  switch (strategy::LowPrecisionSpeedOn(at::kBFloat16, launch::CpuFlags(),
                                        launch::CpuVendor())) {
    case strategy::LowPrecisionSpeed::kNoFaster:
      bf16_target += "; not on this CPU: Intel without AMX computes bf16 no "
                     "faster than fp32";
      break;
    case strategy::LowPrecisionSpeed::kEmulated:
      bf16_target += "; this CPU has none: bf16 is emulated";
      break;
    case strategy::LowPrecisionSpeed::kFaster:
      break;
  }
  if (peak.bf16_gflops > 0) {
    char buf[80];
    std::snprintf(buf, sizeof(buf), "; one core's peak bf16 / fp32 %.2f",
                  peak.bf16_gflops / peak.fp32_gflops);
    bf16_target += buf;
  }
  for (const Model& m : chosen) {
    for (int64_t n : nprocs) {
      const std::string what = m.name + " N=" + std::to_string(n) +
                               " FULL_SHARD bf16 / fp32 tokens/s";
      ratio_line(what, find(m.name, "bf16", n, "full_shard"),
                 find(m.name, "fp32", n, "full_shard"), true, bf16_target);
    }
  }
  if (python_ddp == "0") {
    std::printf("\nPyTorch DDP: not run (--python-ddp 0)\n");
  } else if (!want_python) {
    std::printf("\nPyTorch DDP: skipped (python3 cannot import torch; bash "
                "scripts/setup.sh)\n");
  } else {
    std::printf("\nPyTorch: torch %s, gloo, bench/python_ddp_gpt.py, its own allocator "
                "(torch_no_comm: the same without DDP; torch_fsdp2: its fully_shard)\n",
                torch_version.c_str());
  }
  std::printf("load at the end: %s\n", LoadAverage().c_str());
  if (!svg.empty()) {
    std::ostringstream caption;
    caption << "bench/matrix: " << cores << " cores, bf16 " << Bf16Support() << "; "
            << warmup << "+" << steps << " steps x " << rounds
            << " rounds; PyTorch on gloo with its own allocator";
    WriteChart(svg, RatioChartSvg("fsdp2 against PyTorch 2.11 on the same CPU "
                                  "(> 1: fsdp2 faster or smaller)",
                                  caption.str(), bars));
    std::printf("chart: %s\n", svg.c_str());
  }
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
    flags.String("role", "train", "train (rank processes)");
    bench::ModelFlags defaults;
    return bench::RunTrainRank(flags, defaults);
  } catch (const std::exception& e) {
    std::cerr << "matrix bench: " << e.what() << "\n";
    return 1;
  }
}
