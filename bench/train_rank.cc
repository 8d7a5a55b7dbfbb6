#include "bench/train_rank.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm/device_mesh.h"
#include "core/comm/world.h"
#include "core/fsdp/fully_shard.h"
#include "core/launch/local_launcher.h"
#include "core/models/gpt_module.h"
#include "core/strategy/lazy_zero_grad.h"

namespace fsdp2 {
namespace bench {

using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct UnitRef {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;  // a sharded module
};

}  // namespace

ModelFlags ReadModelFlags(flags::Flags& flags, const ModelFlags& defaults) {
  ModelFlags m;
  m.config = ReadGPTConfig(flags, defaults.config);
  m.global_batch =
      flags.Int("global-batch", defaults.global_batch, "sequences per step, all ranks");
  return m;
}

std::vector<std::string> ModelArgs(const ModelFlags& m) {
  std::vector<std::string> args = GPTConfigArgs(m.config);
  args.push_back("--global-batch");
  args.push_back(std::to_string(m.global_batch));
  return args;
}

double StepFlops(const models::GPTConfig& c, int64_t tokens) {
  const double C = c.n_embd;
  const double matmul_params =
      c.n_layer * (12.0 * C * C) + double(c.vocab_size) * C;
  return tokens * (6.0 * matmul_params + 12.0 * c.n_layer * c.block_size * C);
}

int RunGemmRank(flags::Flags& flags) {
  const int64_t n = flags.Int("gemm-size", 2048, "n of the n x n matmuls");
  flags.Finish();
  at::set_num_threads(ThreadsFromLauncher());
  at::Tensor a = at::randn({n, n}), b = at::randn({n, n}), c = at::empty({n, n});
  std::vector<double> gflops;
  for (int i = 0; i < 7; ++i) {
    const auto start = Clock::now();
    at::mm_out(c, a, b);
    const double s = Seconds(start);
    if (i >= 2) gflops.push_back(2.0 * n * n * n / s / 1e9);
  }
  WriteResult("gemm_gflops", Median(gflops));
  std::printf("gemm %lldx%lld, %d threads: %.1f GFLOP/s\n", (long long)n,
              (long long)n, at::get_num_threads(), Median(gflops));
  return 0;
}


int RunTrainRank(flags::Flags& flags, const ModelFlags& defaults) {
  const ModelFlags m = ReadModelFlags(flags, defaults);
  const std::string strategy =
      flags.String("strategy", "full_shard", "single (no engine) or a sharding strategy");
  const int steps = flags.Int("steps", 20, "timed steps");
  const int warmup = flags.Int("warmup", 3, "untimed steps first");
  const std::string precision =
      flags.String("mixed-precision", "fp32", "fp32|bf16 (bf16 compute, fp32 shards)");
  flags.Finish();
  if (precision != "fp32" && precision != "bf16") {
    throw std::invalid_argument("--mixed-precision must be fp32 or bf16, got '" +
                                precision + "'");
  }
  if (precision == "bf16" && strategy == "single") {
    throw std::invalid_argument("--mixed-precision bf16 needs the engine, not 'single'");
  }
  at::set_num_threads(ThreadsFromLauncher());

  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  const int rank = world->rank(), n = world->size();
  if (m.global_batch % n != 0) {
    throw std::invalid_argument("--global-batch must be a multiple of the ranks");
  }
  const int64_t batch = m.global_batch / n, T = m.config.block_size;
  const models::GPTConfig& config = m.config;

  torch::manual_seed(1337);
  models::GPTModule module(config, models::GPT2AdamW(3e-3));
  models::GPT model = module.gpt();
  std::vector<UnitRef> units;
  if (strategy != "single") {
    fsdp::FSDPOptions options;
    options.mesh = comm::DeviceMesh::Create(world, {n}, {"dp"});
    options.strategy = fsdp::ParseShardingStrategy(strategy);
    if (precision == "bf16") {  // as strategy::DefaultMixedPrecision()
      options.mp_policy.param_dtype = at::kBFloat16;
      options.mp_policy.reduce_dtype = at::kFloat;
      options.mp_policy.output_dtype = at::kFloat;
    }
    for (size_t i = 0; i < model->blocks->size(); ++i) {
      fsdp::fully_shard(model->block(i), options);
    }
    fsdp::fully_shard(model, options);
    for (const auto& item : model->named_modules("", /*include_self=*/true)) {
      if (fsdp::unit_of(*item.value())) {
        units.push_back({item.key().empty() ? "root" : item.key(), item.value()});
      }
    }
  }
  auto optimizer = module.configure_optimizers();
  // Peak memory of training: the high-water mark restarts once the model is
  // sharded and the optimizer built (every rank builds the whole model
  // first); the process's own peak keeps that build.
  const int64_t build_peak = PeakResidentBytes();
  ResetPeakResidentBytes();

  // A few fixed batches of random tokens (this rank's rows of each global
  // batch), made before timing starts.
  auto gen = at::detail::createCPUGenerator(7);
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int i = 0; i < 4; ++i) {
    at::Tensor global = at::randint(config.vocab_size, {m.global_batch, T + 1},
                                    gen, at::TensorOptions().dtype(at::kLong));
    at::Tensor mine = global.narrow(0, rank * batch, batch);
    batches.emplace_back(mine.narrow(1, 0, T).contiguous(),
                         mine.narrow(1, 1, T).contiguous());
  }

  std::vector<double> step_s, forward_s, backward_s, update_s;
  strategy::LazyZeroGrad zero_grad;  // as FSDP2Strategy::optimizer_step
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup) {
      fsdp::reset_comm_wait_stats(*model);
    }
    const auto& [x, y] = batches[step % batches.size()];
    const auto start = Clock::now();
    zero_grad.zero_grad(*optimizer);
    at::Tensor loss = module.training_step({x, y}, step);
    const auto forward_end = Clock::now();
    loss.backward();
    const auto backward_end = Clock::now();
    zero_grad.materialize();
    if (strategy == "single") {
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    } else {
      fsdp::clip_grad_norm_(*model, 1.0);
    }
    optimizer->step();
    if (step < warmup) continue;
    step_s.push_back(Seconds(start));
    forward_s.push_back(std::chrono::duration<double>(forward_end - start).count());
    backward_s.push_back(
        std::chrono::duration<double>(backward_end - forward_end).count());
    update_s.push_back(Seconds(backward_end));
  }

  // Per step, the slowest rank's time; per unit, the mean over ranks.
  at::Tensor times = at::tensor(step_s, at::kDouble);
  world->group()->all_reduce(times, comm::ReduceOp::kMax).wait();
  at::Tensor waits = at::zeros({static_cast<int64_t>(units.size()), 3}, at::kDouble);
  for (size_t i = 0; i < units.size(); ++i) {
    const fsdp::CommWaitStats s = fsdp::comm_wait_stats(*units[i].module);
    waits[i][0] = s.all_gather_wait_s / steps;
    waits[i][1] = s.reduce_wait_s / steps;
    waits[i][2] = s.copy_in_s / steps;
  }
  world->group()->all_reduce(waits).wait();
  waits.div_(n);
  at::Tensor peak = at::tensor(
      {static_cast<double>(PeakResidentBytes()),
       static_cast<double>(std::max(build_peak, PeakResidentBytes()))},
      at::kDouble);
  world->group()->all_reduce(peak, comm::ReduceOp::kMax).wait();
  if (rank == 0) {
    for (int64_t i = 0; i < times.numel(); ++i) {
      WriteResult("step_s", times[i].item<double>());
    }
    WriteResult("forward_s", Median(forward_s));
    WriteResult("backward_s", Median(backward_s));
    WriteResult("update_s", Median(update_s));
    WriteResult("threads", at::get_num_threads());
    WriteResult("peak_rss_mib", peak[0].item<double>() / (1024.0 * 1024.0));
    WriteResult("peak_process_mib", peak[1].item<double>() / (1024.0 * 1024.0));
    for (size_t i = 0; i < units.size(); ++i) {
      std::ostringstream line;
      line << units[i].name << " " << waits[i][0].item<double>() << " "
           << waits[i][1].item<double>() << " " << waits[i][2].item<double>();
      WriteResult("unit", line.str());
    }
  }
  return 0;
}

bool PythonTorchAvailable() {
  return std::system((std::string(FSDP2_PYTHON) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
}

PythonDdpResult RunPythonDdp(const ModelFlags& m, int nproc, int threads, bool bf16,
                             int steps, int warmup, PythonMode mode) {
  PythonDdpResult result;
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string script =
      std::string(workspace ? workspace : ".") + "/bench/python_ddp_gpt.py";
  std::ostringstream cmd;
  // As users run PyTorch: its own allocator (no LD_PRELOAD), with the
  // OpenBLAS core type that makes its GEMMs fast on this CPU.
  for (const auto& [k, v] : launch::CpuPerformanceEnv()) {
    if (k != "LD_PRELOAD") cmd << k << "=" << v << " ";
  }
  cmd << FSDP2_PYTHON << " " << script << " --nproc " << nproc << " --threads "
      << threads << " --steps " << steps << " --warmup " << warmup
      << (bf16 ? " --bf16 1" : "") << (mode == PythonMode::kNoComm ? " --no-comm 1" : "")
      << (mode == PythonMode::kFsdp2 ? " --fsdp2 1" : "");
  for (const auto& a : ModelArgs(m)) cmd << " " << a;
  cmd << " 2>&1";
  FILE* pipe = popen(cmd.str().c_str(), "r");
  if (pipe == nullptr) {
    result.error = "cannot start python3";
    return result;
  }
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), pipe)) out += buf;
  const int rc = pclose(pipe);
  auto value_of = [&](const std::string& key) -> std::string {
    const auto pos = out.rfind(key + " ");
    if (pos == std::string::npos) return "";
    const auto begin = pos + key.size() + 1;
    return out.substr(begin, out.find('\n', begin) - begin);
  };
  const std::string step = value_of("median_step_s");
  if (rc != 0 || step.empty()) {
    result.error = out.size() > 400 ? out.substr(out.size() - 400) : out;
    return result;
  }
  result.ok = true;
  result.median_step_s = std::atof(step.c_str());
  result.peak_rss_mib = std::atof(value_of("peak_rss_mib").c_str());
  result.torch_version = value_of("torch_version");
  return result;
}

}  // namespace bench
}  // namespace fsdp2
