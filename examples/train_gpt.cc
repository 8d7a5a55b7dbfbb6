// fsdp2/examples/train_gpt.cc
//
// Trains a GPT-style language model with FSDP2 on several local processes:
//
//   bazel run //examples:train -- --nproc 2 --steps 50
//
// The text is real: the Python standard library's sources that every Debian
// machine ships (byte-level tokens, vocabulary 256), or synthetic tokens with
// --data synthetic. Each step draws one global batch of nproc * batch-size
// sequences from a generator seeded by (seed, step), and rank r trains on
// rows [r * batch-size, (r + 1) * batch-size). So runs with the same seed and
// the same global batch print the same losses whatever --nproc is.
//
// Under torchrun, srun or mpirun (RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK
// set) each process is one rank and --nproc is ignored.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm/device_mesh.h"
#include "core/comm/world.h"
#include "core/fsdp/fully_shard.h"
#include "core/launch/local_launcher.h"
#include "core/models/gpt.h"
#include "core/strategy/cluster_environment.h"

namespace {

using namespace fsdp2;
namespace fs = std::filesystem;

struct Flags {
  int nproc = 2;
  std::string strategy = "full_shard";
  int steps = 30;
  uint64_t seed = 1337;
  int64_t batch_size = 8;  // per rank
  int64_t block_size = 64;
  int64_t n_layer = 4;
  int64_t n_embd = 128;
  int64_t n_head = 4;
  std::string data = "pystdlib";
  int64_t vocab_size = 256;
  double lr = 3e-3;
  std::string mixed_precision = "fp32";
  int grad_accum = 1;
  double clip = 1.0;
  std::string metrics_out;
  int threads = 0;
  int log_every = 1;
};

const char* kUsage =
    "usage: train [--nproc N] [--strategy full_shard|shard_grad_op|no_shard|"
    "hybrid_shard]\n"
    "             [--steps N] [--seed N] [--batch-size N (per rank)]\n"
    "             [--block-size N] [--n-layer N] [--n-embd N] [--n-head N]\n"
    "             [--data PATH|pystdlib|synthetic] [--vocab-size N (synthetic)]\n"
    "             [--lr X] [--mixed-precision fp32|bf16] [--grad-accum N]\n"
    "             [--clip X (0: off)] [--metrics-out FILE] [--threads N]\n";

[[noreturn]] void Fail(const std::string& message) {
  std::cerr << "train: " << message << "\n";
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  std::map<std::string, std::string> given;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) Fail("unexpected argument '" + arg + "' (see --help)");
    std::string key = arg.substr(2), value;
    auto eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      Fail("flag --" + key + " needs a value");
    }
    given[key] = value;
  }
  auto num = [&](const std::string& key, auto& out) {
    auto it = given.find(key);
    if (it == given.end()) return;
    try {
      size_t used = 0;
      if constexpr (std::is_floating_point<std::decay_t<decltype(out)>>::value) {
        out = std::stod(it->second, &used);
      } else {
        out = static_cast<std::decay_t<decltype(out)>>(std::stoll(it->second, &used));
      }
      if (used != it->second.size()) throw std::invalid_argument("");
    } catch (const std::exception&) {
      Fail("--" + key + " expects a number, got '" + it->second + "'");
    }
    given.erase(it);
  };
  auto str = [&](const std::string& key, std::string& out) {
    auto it = given.find(key);
    if (it == given.end()) return;
    out = it->second;
    given.erase(it);
  };
  num("nproc", f.nproc);
  str("strategy", f.strategy);
  num("steps", f.steps);
  num("seed", f.seed);
  num("batch-size", f.batch_size);
  num("block-size", f.block_size);
  num("n-layer", f.n_layer);
  num("n-embd", f.n_embd);
  num("n-head", f.n_head);
  str("data", f.data);
  num("vocab-size", f.vocab_size);
  num("lr", f.lr);
  str("mixed-precision", f.mixed_precision);
  num("grad-accum", f.grad_accum);
  num("clip", f.clip);
  str("metrics-out", f.metrics_out);
  num("threads", f.threads);
  num("log-every", f.log_every);
  if (!given.empty()) Fail("unknown flag --" + given.begin()->first + " (see --help)");

  if (f.nproc < 1) Fail("--nproc must be at least 1, got " + std::to_string(f.nproc));
  if (f.steps < 1) Fail("--steps must be at least 1");
  if (f.batch_size < 1) Fail("--batch-size must be at least 1");
  if (f.grad_accum < 1) Fail("--grad-accum must be at least 1");
  if (f.mixed_precision != "fp32" && f.mixed_precision != "bf16") {
    Fail("--mixed-precision must be fp32 or bf16, got '" + f.mixed_precision + "'");
  }
  try {
    fsdp::ParseShardingStrategy(f.strategy);
  } catch (const std::exception& e) {
    Fail(std::string("--strategy: ") + e.what());
  }
  if (f.data != "synthetic" && f.data != "pystdlib") {
    if (!fs::exists(f.data)) Fail("--data " + f.data + ": no such file");
    if (fs::is_directory(f.data)) {
      Fail("--data " + f.data + ": is a directory, expected a text file");
    }
  }
  if (f.strategy == "hybrid_shard" && (f.nproc < 2 || f.nproc % 2 != 0)) {
    Fail("--strategy hybrid_shard needs an even --nproc (a 2 x nproc/2 mesh)");
  }
  return f;
}

// All *.py files under the newest /usr/lib/python3.* as one byte stream.
std::string PythonStdlibText(size_t max_bytes) {
  std::vector<fs::path> roots;
  for (const auto& e : fs::directory_iterator("/usr/lib")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("python3.", 0) == 0 && fs::exists(e.path() / "os.py")) {
      roots.push_back(e.path());
    }
  }
  if (roots.empty()) {
    throw std::runtime_error(
        "no Python standard library under /usr/lib/python3.* (install "
        "python3, or pass --data PATH or --data synthetic)");
  }
  std::sort(roots.begin(), roots.end());
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(
           roots.back(), fs::directory_options::skip_permission_denied)) {
    if (e.is_regular_file() && e.path().extension() == ".py") {
      files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), {});
    if (text.size() >= max_bytes) break;
  }
  text.resize(std::min(text.size(), max_bytes));
  return text;
}

at::Tensor LoadTokens(const Flags& f) {
  if (f.data == "synthetic") return at::Tensor();
  std::string text;
  if (f.data == "pystdlib") {
    text = PythonStdlibText(8 << 20);
  } else {
    if (!fs::exists(f.data)) throw std::runtime_error("--data " + f.data + ": no such file");
    if (fs::is_directory(f.data)) {
      throw std::runtime_error("--data " + f.data + ": is a directory, expected a text file");
    }
    std::ifstream in(f.data, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  if (static_cast<int64_t>(text.size()) < f.block_size + 2) {
    throw std::runtime_error("--data " + f.data + ": too short for --block-size");
  }
  at::Tensor bytes = at::from_blob(text.data(), {static_cast<int64_t>(text.size())},
                                   at::kByte)
                         .to(at::kLong);
  return bytes;
}

// Global batch `step`: `rows` windows of block_size + 1 tokens.
at::Tensor GlobalBatch(const Flags& f, const at::Tensor& tokens, int step,
                       int64_t rows, int64_t vocab) {
  auto gen = at::detail::createCPUGenerator(f.seed * 1000003 + step);
  const int64_t T = f.block_size + 1;
  if (!tokens.defined()) {
    return at::randint(vocab, {rows, T}, gen, at::TensorOptions().dtype(at::kLong));
  }
  at::Tensor starts = at::randint(tokens.size(0) - T, {rows}, gen,
                                  at::TensorOptions().dtype(at::kLong));
  at::Tensor index = starts.unsqueeze(1) + at::arange(T, at::kLong).unsqueeze(0);
  return tokens.index_select(0, index.reshape({-1})).view({rows, T});
}

int64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

int RunRank(const Flags& f) {
  const char* threads_env = std::getenv("FSDP2_THREADS");
  at::set_num_threads(f.threads > 0 ? f.threads
                                    : (threads_env ? std::atoi(threads_env) : 1));
  const auto cluster = strategy::ClusterEnvironment::Detect();
  auto world = comm::World::Init(cluster.ToRendezvous(
      std::chrono::seconds(300), std::getenv("FSDP2_BACKEND") ? std::getenv("FSDP2_BACKEND") : "gloo"));
  const int rank = world->rank(), n = world->size();

  at::Tensor tokens = LoadTokens(f);
  models::GPTConfig config;
  config.vocab_size = tokens.defined() ? 256 : f.vocab_size;
  config.block_size = f.block_size;
  config.n_layer = f.n_layer;
  config.n_head = f.n_head;
  config.n_embd = f.n_embd;
  config.Validate();
  torch::manual_seed(f.seed);
  models::GPT model(config);

  fsdp::FSDPOptions options;
  options.strategy = fsdp::ParseShardingStrategy(f.strategy);
  options.mesh = options.strategy == fsdp::ShardingStrategy::kHybridShard
                     ? comm::DeviceMesh::Create(world, {2, n / 2}, {"replicate", "shard"})
                     : comm::DeviceMesh::Create(world, {n}, {"dp"});
  if (f.mixed_precision == "bf16") {
    options.mp_policy.param_dtype = at::kBFloat16;
    options.mp_policy.reduce_dtype = at::kFloat;
    options.mp_policy.output_dtype = at::kFloat;
  }
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    fsdp::fully_shard(model->block(i), options);
  }
  fsdp::fully_shard(model, options);
  torch::optim::AdamW optimizer(
      model->parameters(),
      torch::optim::AdamWOptions(f.lr).betas({0.9, 0.95}).weight_decay(0.1));

  std::ofstream metrics;
  if (rank == 0) {
    std::printf("model: %s\n", config.ToString().c_str());
    std::printf("data: %s (%lld tokens); %d ranks x %lld sequences x %d micro-batches; %s on %s; %s\n",
                tokens.defined() ? f.data.c_str() : "synthetic",
                tokens.defined() ? (long long)tokens.size(0) : 0LL, n,
                (long long)f.batch_size, f.grad_accum, fsdp::ToString(options.strategy),
                options.mesh->ToString().c_str(), f.mixed_precision.c_str());
    if (!f.metrics_out.empty()) {
      metrics.open(f.metrics_out);
      if (!metrics) throw std::runtime_error("cannot write --metrics-out " + f.metrics_out);
    }
  }
  const int64_t B = f.batch_size;
  const int64_t tokens_per_step = n * B * f.grad_accum * f.block_size;
  for (int step = 0; step < f.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    at::Tensor batch =
        GlobalBatch(f, tokens, step, n * B * f.grad_accum, config.vocab_size);
    optimizer.zero_grad();
    double local_loss = 0;
    for (int micro = 0; micro < f.grad_accum; ++micro) {
      fsdp::set_requires_gradient_sync(*model, micro == f.grad_accum - 1);
      at::Tensor rows = batch.narrow(0, (int64_t{micro} * n + rank) * B, B);
      at::Tensor logits = fsdp::forward(model, rows.narrow(1, 0, f.block_size));
      at::Tensor loss =
          models::LanguageModelLoss(logits, rows.narrow(1, 1, f.block_size)) /
          f.grad_accum;
      loss.backward();
      local_loss += loss.item<double>();
    }
    double grad_norm = f.clip > 0 ? fsdp::clip_grad_norm_(*model, f.clip) : 0.0;
    optimizer.step();
    // Loss and peak memory of every rank, for the log line.
    at::Tensor report = at::zeros({2 * n}, at::kDouble);
    report[rank] = local_loss;
    report[n + rank] = static_cast<double>(PeakRssBytes());
    world->group()->all_reduce(report).wait();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double loss = report.narrow(0, 0, n).sum().item<double>() / n;
    if (rank == 0) {
      if ((step + 1) % f.log_every == 0 || step + 1 == f.steps) {
        std::printf("step %4d/%d  loss %.4f  grad_norm %.3f  %.0f tok/s  %.0f ms  peak_rss %.0f MiB\n",
                    step + 1, f.steps, loss, grad_norm, tokens_per_step / seconds,
                    seconds * 1e3, report.narrow(0, n, n).max().item<double>() / (1 << 20));
        std::fflush(stdout);
      }
      if (metrics.is_open()) {
        metrics.precision(10);
        metrics << "{\"step\": " << step + 1 << ", \"loss\": " << loss
                << ", \"grad_norm\": " << grad_norm
                << ", \"tokens_per_s\": " << tokens_per_step / seconds
                << ", \"step_ms\": " << seconds * 1e3 << ", \"peak_rss_bytes\": [";
        for (int r = 0; r < n; ++r) {
          metrics << (r ? ", " : "") << static_cast<int64_t>(report[n + r].item<double>());
        }
        metrics << "]}\n";
        metrics.flush();
      }
    }
  }
  auto stats = fsdp::memory_stats(*model);
  std::printf("rank %d: sharded params %.2f MiB of %.2f MiB, peak unsharded params %.2f MiB\n",
              rank, stats.sharded_param_bytes / 1048576.0,
              stats.total_param_numel * 4 / 1048576.0,
              fsdp::peak_unsharded_param_bytes() / 1048576.0);
  world->group()->barrier().wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = ParseFlags(argc, argv);
  try {
    // Started by torchrun, srun or mpirun: this process is one rank.
    // Otherwise launch --nproc local ranks.
    if (strategy::ClusterEnvironment::Detect().kind == strategy::ClusterKind::kLocal) {
      launch::LocalLaunchOptions options;
      options.nproc = flags.nproc;
      options.threads_per_rank = flags.threads;
      options.argv.assign(argv, argv + argc);
      return launch::LaunchLocal(options);
    }
    return RunRank(flags);
  } catch (const std::exception& e) {
    std::cerr << "train: " << e.what() << "\n";
    return 1;
  }
}
