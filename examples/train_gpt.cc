// fsdp2/examples/train_gpt.cc
//
// Trains a GPT-style language model with FSDP2 on several local processes:
//
//   bazel run //examples:train -- --nproc 2 --steps 50
//
// The text is real: the Python standard library's sources that every Debian
// machine ships (byte-level tokens, vocabulary 256), or synthetic tokens with
// --data synthetic. Training runs through FSDP2Strategy and Trainer: each
// step takes one global batch of nproc * batch-size windows from the
// distributed sampler, rank r trains on rows [r * batch-size, (r + 1) *
// batch-size), so runs with the same seed and the same global batch print the
// same losses whatever --nproc is. Metrics (JSON lines, CSV) and the loss
// curve (SVG) go to --out-dir.
//
// With --max-restarts N, when a rank dies the launcher stops all ranks and
// starts them again (up to N times); a restarted job resumes from the newest
// complete checkpoint in --ckpt-dir. For tests, FSDP2_FAULT_AT_STEP=R:S
// makes rank R kill itself (SIGKILL) after step S of the first run.
//
// Under torchrun, srun or mpirun (RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK
// set) each process is one rank and --nproc is ignored.
#include <sched.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/hf_checkpoint.h"
#include "core/comm/backend.h"
#include "core/comm/device_mesh.h"
#include "core/comm/world.h"
#include "core/flags/flags.h"
#include "core/fsdp/fully_shard.h"
#include "core/launch/allocator.h"
#include "core/launch/local_launcher.h"
#include "core/models/gpt.h"
#include "core/models/gpt_module.h"
#include "core/models/llama_module.h"
#include "core/strategy/cluster_environment.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/fsdp_controls.h"
#include "core/strategy/trainer.h"

namespace {

using namespace fsdp2;
namespace fs = std::filesystem;

struct Flags {
  int nproc = 2;
  int tensor_parallel = 1;  // ranks per tensor-parallel group
  std::string strategy = "full_shard";
  int shard_group_size = 0;
  int prefetch_depth = 1;  // forward and backward
  int reshard_after_forward = -1;  // -1: the strategy's default
  std::string grad_accum_mode = "local";
  std::string ignored_params;  // names or globs, comma-separated
  int ignored_params_all_reduce = 1;
  std::string forward_prefetch_modules, backward_prefetch_modules;  // "unit:a,b;..."
  int timeout_s = 300;  // FSDP2_TIMEOUT_S, when set, is the default
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
  int64_t val_every = 10;
  std::string out_dir;  // default: ./fsdp2_out
  std::string ckpt_dir;  // save a checkpoint (a directory) at the end
  int64_t ckpt_every = 0;
  std::string resume;    // continue from this checkpoint
  std::string checkpoint_format = "sharded";
  int64_t ckpt_keep = 0;  // >0: save to ckpt-dir/step-N, keep the newest N
  bool ckpt_async = false;  // write checkpoints in the background
  int max_restarts = 0;     // restarts of all ranks after a rank fails
  int progress_bar = -1;
  int activation_checkpointing = 0;  // 1: recompute blocks in backward
  int ac_every = 1;                  // with it: every k-th block
  std::string device = "auto";
  std::string init_from;  // the model's weights from this safetensors file
  std::string data_tokens;  // uint8|uint16|int32: --data is a flat token file
  std::string hf_model;     // train this Hugging Face checkpoint instead of a GPT
  std::string save_hf, save_hf_shard_size = "5GB", save_hf_dtype;
  std::string frozen_params;  // names or globs, comma-separated
};

const char* kUsage =
    "usage: train [--flag value ...]\n"
    "Trains a GPT with FSDP2 on --nproc local ranks (one rank per process under\n"
    "torchrun, srun or mpirun).\n";

[[noreturn]] void Fail(const std::string& message) {
  std::cerr << "train: " << message << "\n";
  std::exit(2);
}

// The complete step-<N> checkpoints in `dir`, oldest first.
std::vector<std::string> KeptCheckpoints(const std::string& dir) {
  std::vector<std::pair<long long, std::string>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.find_first_not_of("0123456789", 5) != std::string::npos ||
        name.size() == 5 || checkpoint::NewestCheckpoint(e.path().string()) != e.path().string()) {
      continue;
    }
    steps.emplace_back(std::stoll(name.substr(5)), e.path().string());
  }
  std::sort(steps.begin(), steps.end());
  std::vector<std::string> out;
  for (auto& item : steps) out.push_back(std::move(item.second));
  return out;
}

// The directory the first save writes: --ckpt-dir, or with --ckpt-keep a
// step-N directory inside it.
std::string CheckpointTarget(const Flags& f) {
  return f.ckpt_keep > 0 ? (fs::path(f.ckpt_dir) / "step-0").string() : f.ckpt_dir;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  try {
    flags::Flags parser(argc, argv, kUsage);
    f.nproc = parser.Int("nproc", f.nproc, "local ranks to start");
    f.tensor_parallel =
        parser.Int("tensor-parallel", f.tensor_parallel, "ranks per tensor-parallel group");
    f.strategy = parser.String("strategy", f.strategy,
                               "full_shard|shard_grad_op|no_shard|hybrid_shard");
    f.shard_group_size = parser.Int(
        "shard-group-size", f.shard_group_size,
        "hybrid_shard: ranks per shard group (0: the ranks of one host)");
    if (const char* t = std::getenv("FSDP2_TIMEOUT_S")) f.timeout_s = std::atoi(t);
    f.timeout_s = parser.Int("timeout", f.timeout_s,
                             "seconds a rendezvous or collective may take (default: "
                             "FSDP2_TIMEOUT_S or 300)");
    f.steps = parser.Int("steps", f.steps, "optimizer steps");
    f.seed = parser.Int("seed", f.seed, "seed of the model, the data and the sampler");
    f.batch_size =
        parser.Int("batch-size", f.batch_size, "sequences per data-parallel rank and step");
    f.block_size = parser.Int("block-size", f.block_size, "tokens per sequence");
    f.n_layer = parser.Int("n-layer", f.n_layer, "transformer blocks");
    f.n_embd = parser.Int("n-embd", f.n_embd, "embedding width");
    f.n_head = parser.Int("n-head", f.n_head, "attention heads");
    f.data = parser.String("data", f.data, "PATH (a text file), pystdlib or synthetic");
    f.vocab_size = parser.Int("vocab-size", f.vocab_size, "vocabulary of --data synthetic");
    f.lr = parser.Double("lr", f.lr, "AdamW learning rate");
    f.mixed_precision = parser.String("mixed-precision", f.mixed_precision, "fp32|bf16");
    f.grad_accum = parser.Int("grad-accum", f.grad_accum, "micro-batches per step");
    f.clip = parser.Double("clip", f.clip, "gradient clipping norm (0: off)");
    f.metrics_out = parser.String("metrics-out", f.metrics_out,
                                  "metrics JSON lines (default: out-dir/metrics.jsonl)");
    f.threads = parser.Int("threads", f.threads,
                           "threads per rank (0: cores / nproc; under an outside "
                           "launcher OMP_NUM_THREADS, else the host's cores / its ranks)");
    f.log_every = parser.Int("log-every", f.log_every, "steps between log lines");
    f.val_every = parser.Int("val-every", f.val_every, "steps between validations");
    f.out_dir = parser.String("out-dir", f.out_dir,
                              "metrics and loss curve (default: ./fsdp2_out)");
    f.progress_bar = parser.Int("progress-bar", f.progress_bar,
                                "1: a progress bar, 0: log lines, -1: a bar on a terminal");
    f.ckpt_dir = parser.String("ckpt-dir", f.ckpt_dir,
                               "save a checkpoint (a directory, either format) here at the end");
    f.ckpt_every = parser.Int("ckpt-every", f.ckpt_every, "steps between checkpoints");
    f.resume = parser.String("resume", f.resume, "continue from this checkpoint");
    f.checkpoint_format =
        parser.String("checkpoint-format", f.checkpoint_format, "sharded|full");
    f.ckpt_keep = parser.Int("ckpt-keep", f.ckpt_keep,
                             "K > 0: save to ckpt-dir/step-N, keep the newest K");
    f.activation_checkpointing = parser.Int(
        "activation-checkpointing", f.activation_checkpointing,
        "1: recompute each block's activations in backward instead of keeping them");
    f.ac_every = parser.Int("ac-every", f.ac_every,
                            "with --activation-checkpointing 1: every k-th block (1: all)");
    f.prefetch_depth = parser.Int("prefetch-depth", f.prefetch_depth,
                                  "units all-gathered ahead in forward and backward "
                                  "(0: none, least memory)");
    f.reshard_after_forward = parser.Int(
        "reshard-after-forward", f.reshard_after_forward,
        "-1: the strategy's default, 0: keep parameters gathered until backward, 1: free "
        "them, K: keep them sharded over groups of K ranks (a host's) so backward "
        "all-gathers stay inside the group");
    f.grad_accum_mode = parser.String(
        "grad-accum-mode", f.grad_accum_mode,
        "local (keep unsharded gradients until the last micro-batch) | sharded "
        "(reduce-scatter each micro-batch, all-reduce across replicas at the last)");
    f.ignored_params = parser.String(
        "ignored-params", f.ignored_params,
        "parameters kept out of sharding, whole on every rank: names or globs, "
        "comma-separated, e.g. \"wpe.weight\" (not cast to bf16)");
    f.ignored_params_all_reduce = parser.Int(
        "ignored-params-all-reduce", f.ignored_params_all_reduce,
        "1: backward all-reduces the ignored parameters' gradients (training equals one "
        "process); 0: each rank keeps its own");
    f.forward_prefetch_modules = parser.String(
        "forward-prefetch-modules", f.forward_prefetch_modules,
        "explicit forward prefetch lists in place of the depth: "
        "\"blocks.0:blocks.1,blocks.2;blocks.1:blocks.3\" (\"\" before ':' is the root)");
    f.backward_prefetch_modules = parser.String(
        "backward-prefetch-modules", f.backward_prefetch_modules,
        "explicit backward prefetch lists, as --forward-prefetch-modules");
    f.device = parser.String("device", f.device,
                             "auto|cpu|cuda|cuda:K (auto: the rank's GPU where there is one)");
    f.init_from = parser.String("init-from", f.init_from,
                                "start from these weights (a safetensors file of full tensors "
                                "by name, e.g. a PyTorch model's state_dict) instead of a "
                                "random initialisation");
    f.data_tokens = parser.String("data-tokens", f.data_tokens,
                                  "uint8|uint16|int32: --data PATH is a flat file of token ids "
                                  "of that type (no header), not text");
    f.hf_model = parser.String("hf-model", f.hf_model,
                               "DIR: fine-tune this Hugging Face Llama, Mistral or Qwen2 "
                               "checkpoint (config.json + safetensors) instead of a GPT; "
                               "each rank loads only its rows");
    f.save_hf = parser.String("save-hf", f.save_hf,
                              "DIR: after training, save the --hf-model model there in "
                              "transformers' layout (from_pretrained loads it)");
    f.save_hf_shard_size = parser.String("save-hf-shard-size", f.save_hf_shard_size,
                                         "largest file of --save-hf (5GB, 500MB, 2GiB, bytes)");
    f.save_hf_dtype = parser.String("save-hf-dtype", f.save_hf_dtype,
                                    "float32|bfloat16|float16 for --save-hf (default: as trained)");
    f.frozen_params = parser.String("frozen-params", f.frozen_params,
                                    "parameters not trained (names or globs, comma-separated: "
                                    "\"model.embed_tokens.*,model.layers.0.*\")");
    f.ckpt_async = parser.Int("ckpt-async", f.ckpt_async ? 1 : 0,
                              "1: write checkpoints in the background while training goes on") != 0;
    f.max_restarts = parser.Int("max-restarts", f.max_restarts,
                                "when a rank dies, restart all ranks up to N times, resuming "
                                "from the newest checkpoint in --ckpt-dir");
    parser.Finish();
  } catch (const flags::FlagError& e) {
    Fail(e.what());
  }

  if (f.nproc < 1) Fail("--nproc must be at least 1, got " + std::to_string(f.nproc));
  if (f.tensor_parallel < 1) Fail("--tensor-parallel must be at least 1");
  if (f.activation_checkpointing != 0 && f.activation_checkpointing != 1) {
    Fail("--activation-checkpointing must be 0 or 1, got " +
         std::to_string(f.activation_checkpointing));
  }
  if (f.ac_every < 1) Fail("--ac-every must be at least 1, got " + std::to_string(f.ac_every));
  if (f.ac_every != 1 && f.activation_checkpointing == 0) {
    Fail("--ac-every needs --activation-checkpointing 1");
  }
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
  if (!f.hf_model.empty() && !fs::exists(fs::path(f.hf_model) / "config.json")) {
    Fail("--hf-model " + f.hf_model + ": has no config.json (a Hugging Face checkpoint "
         "directory, as save_pretrained writes it)");
  }
  if (!f.save_hf.empty() && f.hf_model.empty()) Fail("--save-hf needs --hf-model");
  try {
    checkpoint::ParseShardSize(f.save_hf_shard_size);  // refused now, not after training
  } catch (const std::exception& e) {
    Fail(std::string("--save-hf-shard-size: ") + e.what());
  }
  if (!f.save_hf_dtype.empty() && f.save_hf_dtype != "float32" && f.save_hf_dtype != "bfloat16" &&
      f.save_hf_dtype != "float16") {
    Fail("--save-hf-dtype must be float32, bfloat16 or float16, got '" + f.save_hf_dtype + "'");
  }
  if (!f.data_tokens.empty() && f.data_tokens != "uint8" && f.data_tokens != "uint16" &&
      f.data_tokens != "int32") {
    Fail("--data-tokens must be uint8, uint16 or int32, got '" + f.data_tokens + "'");
  }
  if (f.data != "synthetic" && f.data != "pystdlib") {
    if (!fs::exists(f.data)) Fail("--data " + f.data + ": no such file");
    if (fs::is_directory(f.data)) {
      Fail("--data " + f.data + ": is a directory, expected a text file");
    }
  }
  if (!f.init_from.empty() && !fs::is_regular_file(f.init_from)) {
    Fail("--init-from " + f.init_from + ": no such file");
  }
  if (!f.resume.empty() && !fs::exists(f.resume) && !fs::exists(f.resume + ".old")) {
    Fail("--resume " + f.resume + ": no such checkpoint");
  }
  if (f.checkpoint_format != "sharded" && f.checkpoint_format != "full") {
    Fail("--checkpoint-format must be sharded or full, got '" + f.checkpoint_format + "'");
  }
  if ((f.ckpt_every > 0 || f.ckpt_keep > 0) && f.ckpt_dir.empty()) {
    Fail("--ckpt-every and --ckpt-keep need --ckpt-dir");
  }
  if (f.ckpt_keep < 0) Fail("--ckpt-keep must be positive");
  if (f.max_restarts < 0) Fail("--max-restarts must be 0 or more");
  if (f.shard_group_size < 0) Fail("--shard-group-size must be 0 (a host) or positive");
  if (f.prefetch_depth < 0) Fail("--prefetch-depth must be 0 or more");
  if (f.reshard_after_forward < -1) Fail("--reshard-after-forward must be -1, 0, 1 or a group size");
  if (f.grad_accum_mode != "local" && f.grad_accum_mode != "sharded") {
    Fail("--grad-accum-mode must be local or sharded, got '" + f.grad_accum_mode + "'");
  }
  if (f.ignored_params_all_reduce != 0 && f.ignored_params_all_reduce != 1) {
    Fail("--ignored-params-all-reduce must be 0 or 1");
  }
  try {
    strategy::ParsePrefetchModules(f.forward_prefetch_modules, "--forward-prefetch-modules");
    strategy::ParsePrefetchModules(f.backward_prefetch_modules, "--backward-prefetch-modules");
  } catch (const std::exception& e) {
    Fail(e.what());
  }
  if (f.timeout_s < 1) Fail("--timeout must be at least 1 second");
  if (!f.ckpt_dir.empty()) {
    // Before any training: a target that cannot take a checkpoint fails now.
    try {
      checkpoint::CheckCheckpointTarget(CheckpointTarget(f));
    } catch (const std::exception& e) {
      Fail(std::string("--ckpt-dir ") + e.what());
    }
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
    if (!f.data_tokens.empty()) {
      const at::ScalarType type = f.data_tokens == "uint8"    ? at::kByte
                                  : f.data_tokens == "uint16" ? at::kUInt16
                                                              : at::kInt;
      const int64_t n = static_cast<int64_t>(text.size()) / c10::elementSize(type);
      if (n < f.block_size + 2) throw std::runtime_error("--data " + f.data + ": too short");
      return at::from_blob(text.data(), {n}, type).to(at::kLong);
    }
  }
  if (static_cast<int64_t>(text.size()) < f.block_size + 2) {
    throw std::runtime_error("--data " + f.data + ": too short for --block-size");
  }
  at::Tensor bytes = at::from_blob(text.data(), {static_cast<int64_t>(text.size())},
                                   at::kByte)
                         .to(at::kLong);
  return bytes;
}

// The dataset: non-overlapping windows of block_size + 1 tokens (views of
// the token stream, no copy), inputs and targets shifted by one. The last
// 5% of windows are held out for validation.
std::pair<strategy::Batch, strategy::Batch> Windows(const Flags& f, at::Tensor tokens,
                                                    int64_t vocab) {
  const int64_t T = f.block_size + 1;
  if (!tokens.defined()) {
    auto gen = at::detail::createCPUGenerator(f.seed);
    tokens = at::randint(vocab, {4096 * T}, gen, at::TensorOptions().dtype(at::kLong));
  }
  const int64_t rows = tokens.size(0) / T;
  at::Tensor windows = tokens.narrow(0, 0, rows * T).view({rows, T});
  const int64_t val_rows = std::max<int64_t>(rows / 20, 1);
  auto split = [&](int64_t start, int64_t n) {
    at::Tensor w = windows.narrow(0, start, n);
    return strategy::Batch{w.narrow(1, 0, f.block_size), w.narrow(1, 1, f.block_size)};
  };
  return {split(0, rows - val_rows), split(rows - val_rows, val_rows)};
}

std::string OutputPath(const Flags& f, const std::string& name) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");  // set by bazel run
  fs::path dir = f.out_dir.empty() ? fs::path(cwd ? cwd : ".") / "fsdp2_out" : fs::path(f.out_dir);
  fs::create_directories(dir);
  return (dir / name).string();
}

// Threads for this rank: --threads, else FSDP2_THREADS (the local
// launcher's cores / nproc), else OMP_NUM_THREADS (torchrun sets 1; srun and
// mpirun users set it), else the cores this process may run on (its CPU
// affinity, which a launcher that binds ranks has narrowed) shared among
// the ranks found on its host at rendezvous; never more than there are. It
// used to be 1 whenever the first two were unset, so a rank alone on a
// host of an outside launcher used one core.
int ThreadsPerRank(const Flags& f, const comm::World& world) {
  if (f.threads > 0) return f.threads;
  for (const char* name : {"FSDP2_THREADS", "OMP_NUM_THREADS"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && std::atoi(value) > 0) return std::atoi(value);
  }
  cpu_set_t allowed;
  const int cores = sched_getaffinity(0, sizeof(allowed), &allowed) == 0
                        ? CPU_COUNT(&allowed)
                        : static_cast<int>(std::thread::hardware_concurrency());
  const auto& hosts = world.hosts();
  const auto here = std::count(hosts.begin(), hosts.end(), hosts[world.rank()]);
  return std::max<int>(1, cores / static_cast<int>(here));
}

int RunRank(const Flags& f) {
  strategy::FSDP2StrategyOptions options;
  options.sharding_strategy = fsdp::ParseShardingStrategy(f.strategy);
  // Explicit: data parallelism over whatever tensor parallelism leaves.
  options.tensor_parallel_size = strategy::ParallelSize::Of(f.tensor_parallel);
  options.mp_policy = f.mixed_precision == "bf16" ? strategy::DefaultMixedPrecision()
                                                  : fsdp::MixedPrecisionPolicy{};
  options.seed = f.seed;
  options.data_sampler.seed = f.seed;
  options.checkpoint_format = strategy::ParseCheckpointFormat(f.checkpoint_format);
  if (f.activation_checkpointing == 1) {
    options.activation_checkpointing = f.ac_every == 1
                                           ? fsdp::ActivationCheckpointing::Full()
                                           : fsdp::ActivationCheckpointing::Selective(f.ac_every);
  }
  if (const char* backend = std::getenv("FSDP2_BACKEND")) {
    options.backend = comm::ParseBackend(backend);
  }
  options.device = strategy::DeviceSpec::Parse(f.device);
  options.shard_group_size = f.shard_group_size;
  options.set_reshard_after_forward(f.reshard_after_forward);
  options.forward_prefetch = f.prefetch_depth;
  options.backward_prefetch = f.prefetch_depth;
  options.gradient_accumulation = f.grad_accum_mode == "sharded"
                                      ? strategy::GradientAccumulation::kSharded
                                      : strategy::GradientAccumulation::kLocal;
  options.ignored_params = strategy::SplitNames(f.ignored_params);
  options.ignored_params_all_reduce = f.ignored_params_all_reduce == 1;
  options.forward_prefetch_modules =
      strategy::ParsePrefetchModules(f.forward_prefetch_modules, "--forward-prefetch-modules");
  options.backward_prefetch_modules =
      strategy::ParsePrefetchModules(f.backward_prefetch_modules, "--backward-prefetch-modules");
  options.frozen_params = strategy::SplitNames(f.frozen_params);
  options.timeout = std::chrono::seconds(f.timeout_s);
  strategy::FSDP2Strategy strategy(options);
  strategy.setup_environment();
  const int threads = ThreadsPerRank(f, *strategy.world());
  at::set_num_threads(threads);
  const int rank = strategy.world()->rank();

  at::Tensor tokens = LoadTokens(f);
  models::GPTConfig config;
  config.vocab_size = tokens.defined() && f.data_tokens.empty() ? 256 : f.vocab_size;
  config.block_size = f.block_size;
  config.n_layer = f.n_layer;
  config.n_head = f.n_head;
  config.n_embd = f.n_embd;
  config.Validate();
  // Seeded alike on every rank.
  std::shared_ptr<strategy::TrainingModule> module;
  if (f.hf_model.empty()) {
    module = std::make_shared<models::GPTModule>(config, models::GPT2AdamW(f.lr));
  } else {
    // Built deferred where it can be (no tensor parallelism): no rank ever
    // holds the whole model, on the host or its GPU; parallelize() loads
    // each rank's rows.
    std::optional<fsdp::DeferredInitGuard> deferred;
    if (f.tensor_parallel == 1) {
      deferred.emplace(strategy.tensor_init_context());
    }
    auto llama = models::LlamaModule::FromPretrained(f.hf_model, models::GPT2AdamW(f.lr));
    deferred.reset();
    config.vocab_size = llama->config().vocab_size;
    config.n_layer = llama->config().num_hidden_layers;
    module = llama;
  }
  if (tokens.defined() && tokens.max().item<int64_t>() >= config.vocab_size) {
    throw std::runtime_error("--data " + f.data + " has token ids beyond the model's "
                             "vocabulary (" + std::to_string(config.vocab_size) + ")");
  }
  strategy.connect(module);
  strategy.parallelize();
  if (!f.init_from.empty()) strategy.load_model_state_dict(f.init_from);
  // A restart after a failure resumes from the newest complete checkpoint.
  std::string resume = f.resume;
  if (launch::RestartCount() > 0 && !f.ckpt_dir.empty()) {
    const std::string newest = checkpoint::NewestCheckpoint(f.ckpt_dir);
    if (!newest.empty()) resume = newest;
  }
  if (!resume.empty()) {
    strategy.load_checkpoint(resume);
    if (rank == 0) {
      std::printf("resumed from %s at step %lld\n", resume.c_str(),
                  (long long)strategy.current_epoch_step().step);
    }
  }

  auto [train_set, val_set] = Windows(f, tokens, config.vocab_size);
  const int64_t global_batch = int64_t{strategy.data_parallel_size()} * f.batch_size;
  auto train = strategy.process_dataloader(train_set, global_batch);
  auto val = strategy.process_dataloader(val_set, global_batch);

  strategy::TrainerOptions trainer_options;
  trainer_options.max_steps = f.steps;
  trainer_options.max_epochs = 1000000;
  trainer_options.accumulate_grad_batches = f.grad_accum;
  trainer_options.gradient_clip_val = f.clip;
  trainer_options.val_check_interval = f.val_every;
  trainer_options.limit_val_batches = 4;
  trainer_options.log_every_n_steps = f.log_every;
  trainer_options.tokens_per_row = f.block_size;
  trainer_options.progress_bar = f.progress_bar;
  trainer_options.metrics_jsonl =
      f.metrics_out.empty() ? OutputPath(f, "metrics.jsonl") : f.metrics_out;
  trainer_options.metrics_csv = OutputPath(f, "metrics.csv");
  trainer_options.loss_curve_svg = OutputPath(f, "loss.svg");
  if (!f.ckpt_dir.empty()) {
    // Every --ckpt-every steps (if set) and at the end.
    trainer_options.checkpoint_every_n_steps = f.ckpt_every > 0 ? f.ckpt_every : f.steps;
    trainer_options.checkpoint_dir = CheckpointTarget(f);
    // With --ckpt-keep K: one checkpoint per save, ckpt-dir/step-<N>, and
    // only the newest K kept.
    auto saved = std::make_shared<std::vector<std::string>>();
    // After a restart, the step-N checkpoints of the runs before count too.
    if (f.ckpt_keep > 0 && launch::RestartCount() > 0) *saved = KeptCheckpoints(f.ckpt_dir);
    trainer_options.on_checkpoint = [&f, rank, saved](strategy::FSDP2Strategy& s, int64_t step) {
      std::string path = f.ckpt_dir;
      if (f.ckpt_keep > 0) {
        // Make room first: removing waits for a background save in flight,
        // which is most likely done by now; the new one then overlaps
        // training.
        while (static_cast<int64_t>(saved->size()) >= f.ckpt_keep) {
          s.remove_checkpoint(saved->front());
          saved->erase(saved->begin());
        }
        if (rank == 0) fs::create_directories(f.ckpt_dir);
        s.barrier();
        path = (fs::path(f.ckpt_dir) / ("step-" + std::to_string(step))).string();
      }
      const auto start = std::chrono::steady_clock::now();
      s.save_checkpoint(path, f.ckpt_async);
      if (rank == 0) {
        std::printf("checkpoint: step %lld %s %s in %.0f ms\n", (long long)step,
                    f.ckpt_async ? "staged (written in the background) for" : "saved to",
                    path.c_str(),
                    std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start).count());
      }
      if (f.ckpt_keep > 0) saved->push_back(path);
    };
  }
  if (const char* fault = std::getenv("FSDP2_FAULT_AT_STEP")) {  // tests: R:S
    const std::string spec = fault;
    const int fault_rank = std::stoi(spec.substr(0, spec.find(':')));
    const int64_t fault_step = std::stoll(spec.substr(spec.find(':') + 1));
    trainer_options.on_step_end = [=](strategy::FSDP2Strategy&, int64_t step) {
      if (rank == fault_rank && step == fault_step && launch::RestartCount() == 0) {
        std::fflush(stdout);
        raise(SIGKILL);
      }
    };
  }
  strategy::Trainer trainer(strategy, trainer_options);

  if (rank == 0) {
    if (f.hf_model.empty()) {
      std::printf("model: %s\n", config.ToString().c_str());
    } else {
      std::printf("model: %s (%s, %lld layers, vocabulary %lld)%s%s\n", f.hf_model.c_str(),
                  static_cast<models::LlamaModule&>(*module).config().model_type.c_str(),
                  (long long)config.n_layer, (long long)config.vocab_size,
                  f.frozen_params.empty() ? "" : "; frozen: ", f.frozen_params.c_str());
    }
    std::printf("data: %s (%lld training windows of %lld tokens); %d ranks x %lld "
                "sequences x %d micro-batches; %s on %s; %s\n",
                tokens.defined() ? f.data.c_str() : "synthetic",
                (long long)train_set[0].size(0), (long long)f.block_size,
                strategy.data_parallel_size(),
                (long long)f.batch_size, f.grad_accum,
                fsdp::ToString(options.sharding_strategy),
                strategy.fsdp_mesh()->ToString().c_str(), f.mixed_precision.c_str());
    std::printf("hosts: %d; gloo: %s; threads per rank: %d; device: %s\n",
                strategy.world()->num_hosts(), strategy.world()->network().c_str(), threads,
                strategy.device().str().c_str());
    if (f.activation_checkpointing == 1) {
      std::printf("activation checkpointing: %s, %zu of %lld blocks recomputed in backward\n",
                  options.activation_checkpointing.ToString().c_str(),
                  strategy.checkpointed_modules().size(), (long long)config.n_layer);
    }
    std::fflush(stdout);
  }
  trainer.fit(train, &val);
  if (!f.save_hf.empty()) {
    std::optional<at::ScalarType> dtype;
    if (f.save_hf_dtype == "bfloat16") dtype = at::kBFloat16;
    if (f.save_hf_dtype == "float16") dtype = at::kHalf;
    if (f.save_hf_dtype == "float32") dtype = at::kFloat;
    strategy.save_hf_checkpoint(f.save_hf, checkpoint::ParseShardSize(f.save_hf_shard_size),
                                dtype);
    if (rank == 0) std::printf("saved %s (Hugging Face layout)\n", f.save_hf.c_str());
  }
  auto stats = fsdp::memory_stats(*module->module());
  std::string sent;  // e.g. "shm 1.20 MiB, gloo 0.31 MiB"
  for (const auto& [transport, bytes] : comm::BytesSentByTransport()) {
    char part[64];
    std::snprintf(part, sizeof(part), "%s%s %.2f MiB", sent.empty() ? "" : ", ",
                  transport.c_str(), bytes / 1048576.0);
    sent += part;
  }
  std::printf("rank %d: sharded params %.2f MiB of %.2f MiB, peak unsharded params %.2f MiB, "
              "peak RSS %.1f MiB, allocator %s, sent %s\n",
              rank, stats.sharded_param_bytes / 1048576.0,
              stats.total_param_numel * 4 / 1048576.0,
              fsdp::peak_unsharded_param_bytes() / 1048576.0,
              strategy.memory_stats().peak_rss_bytes / 1048576.0,
              launch::ActiveAllocator().c_str(),
              sent.empty() ? "nothing" : sent.c_str());
  if (!strategy.device().is_cpu()) {
    const auto device = strategy.memory_stats();
    std::printf("rank %d: %s memory: peak allocated %.1f MiB, peak reserved %.1f MiB\n", rank,
                strategy.device().str().c_str(), device.peak_device_allocated_bytes / 1048576.0,
                device.peak_device_reserved_bytes / 1048576.0);
  }
  if (rank == 0) {
    std::printf("metrics: %s, %s; loss curve: %s\n", trainer_options.metrics_jsonl.c_str(),
                trainer_options.metrics_csv.c_str(), trainer_options.loss_curve_svg.c_str());
  }
  strategy.barrier();
  strategy.teardown();
  return 0;
}

}  // namespace

// The sizes that --nproc must fit when this process launches the ranks
// (under an outside launcher the world size decides, in FSDP2Strategy).
void CheckLocalSizes(const Flags& f) {
  if (f.tensor_parallel < 1 || f.nproc % f.tensor_parallel != 0) {
    Fail("--tensor-parallel must divide --nproc (" + std::to_string(f.nproc) + "), got " +
         std::to_string(f.tensor_parallel));
  }
  if (f.shard_group_size > 0 && (f.nproc / f.tensor_parallel) % f.shard_group_size != 0) {
    Fail("--shard-group-size must divide the " + std::to_string(f.nproc / f.tensor_parallel) +
         " data-parallel ranks, got " + std::to_string(f.shard_group_size));
  }
}

int main(int argc, char** argv) {
  Flags flags = ParseFlags(argc, argv);
  try {
    // Started by torchrun, srun or mpirun: this process is one rank.
    // Otherwise launch --nproc local ranks.
    if (strategy::ClusterEnvironment::Detect().kind == strategy::ClusterKind::kLocal) {
      // The launcher starts every rank with the allocator (allocator.h)
      // and the rest of CpuPerformanceEnv (local_launcher.h).
      CheckLocalSizes(flags);
      launch::LocalLaunchOptions options;
      options.nproc = flags.nproc;
      options.threads_per_rank = flags.threads;
      options.max_restarts = flags.max_restarts;
      options.argv.assign(argv, argv + argc);
      return launch::LaunchLocal(options);
    }
    // Started by an outside launcher: restart once with what the local
    // launcher gives its ranks (allocator, OpenBLAS core type, OpenMP
    // waiting) if it is not in place yet.
    launch::ReexecWithRankEnvironment(argv);
    return RunRank(flags);
  } catch (const std::exception& e) {
    std::cerr << "train: " << e.what() << "\n";
    return 1;
  }
}
