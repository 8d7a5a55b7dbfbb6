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
#include <map>
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
#include "core/fsdp/fully_shard.h"
#include "core/launch/allocator.h"
#include "core/launch/local_launcher.h"
#include "core/models/gpt.h"
#include "core/models/gpt_module.h"
#include "core/models/llama_module.h"
#include "core/strategy/cluster_environment.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/fsdp_controls.h"
#include "core/strategy/option_table.h"
#include "core/strategy/token_dataset.h"
#include "core/strategy/trainer.h"
#include "examples/flags/flags.h"

namespace {

using namespace fsdp2;
namespace fs = std::filesystem;

struct Flags {
  int nproc = 2;
  // Every option of the option table with a flag (--strategy, --seed,
  // --gradient-divide-factor, ...), read by ReadOptionFlags: the strategy's,
  // the step's (--grad-accum, --clip) and the optimizer's (--lr).
  strategy::FSDP2StrategyOptions options;
  strategy::TrainerOptions step;
  strategy::OptimizerOptions optimizer;
  int timeout_s = 300;  // FSDP2_TIMEOUT_S, when set, is the default
  int steps = 30;
  int64_t batch_size = 8;  // per rank
  int64_t block_size = 64;
  int64_t n_layer = 4;
  int64_t n_embd = 128;
  int64_t n_head = 4;
  std::string data = "pystdlib";
  int64_t vocab_size = 256;
  std::string metrics_out;
  int threads = 0;
  int log_every = 1;
  int64_t val_every = 10;
  std::string out_dir;  // default: ./fsdp2_out
  std::string ckpt_dir;  // save a checkpoint (a directory) at the end
  int64_t ckpt_every = 0;
  std::string resume;    // continue from this checkpoint
  int64_t ckpt_keep = 0;  // >0: save to ckpt-dir/step-N, keep the newest N
  bool ckpt_async = false;  // write checkpoints in the background
  int max_restarts = 0;     // restarts of all ranks after a rank fails
  int progress_bar = -1;
  int activation_checkpointing = 0;  // 1: recompute blocks in backward
  int ac_every = 1;                  // with it: every k-th block
  std::string init_from;  // the model's weights from this safetensors file
  std::string data_tokens;  // uint8|uint16|int32: --data is a flat token file
  std::string hf_model;     // train this Hugging Face checkpoint instead of a GPT
  std::string save_hf, save_hf_shard_size = "5GB", save_hf_dtype;
  std::string save_hf_merged;  // with LoRA: the merged model, transformers' layout
  int64_t lora_rank = 0;       // > 0: train LoRA adapters of this rank only
  double lora_alpha = 8;
  double lora_dropout = 0;
  std::string lora_target_modules = "q_proj,v_proj";
};

const char* kUsage =
    "usage: train [--flag value ...]\n"
    "Trains a GPT with FSDP2 on --nproc local ranks (one rank per process under\n"
    "torchrun, srun or mpirun).\n";

[[noreturn]] void Fail(const std::string& message) {
  std::cerr << "train: " << message << "\n";
  std::exit(2);
}

// The LoRA options of the flags (rank 0: none).
models::LoraOptions Lora(const Flags& f) {
  models::LoraOptions lora;
  lora.rank = f.lora_rank;
  lora.alpha = f.lora_alpha;
  lora.dropout = f.lora_dropout;
  lora.target_modules = strategy::SplitNames(f.lora_target_modules);
  return lora;
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

// A flag's help: the accepted values, then the row's documentation.
std::string OptionHelp(const strategy::OptionSpec& row) {
  std::string values;
  for (const auto& choice : row.choices) values += (values.empty() ? "" : "|") + choice;
  if (values.empty() && !row.requirement.empty()) values = row.requirement;
  return values.empty() ? row.doc : values + ": " + row.doc;
}

// One flag per row of `table` that names one, its default the row's (or the
// main job's own, flag_default), each value parsed and checked by its row
// and applied to `target`; `defaults` replaces a row's default text. A bad
// value ends the program naming the flag.
template <typename Target>
void ReadOptionFlags(flags::Flags& parser, const strategy::OptionTable<Target>& table,
                     Target* target, const std::map<std::string, std::string>& defaults = {}) {
  for (const auto& row : table) {
    if (row.flag.empty()) continue;
    const auto given_default = defaults.find(row.name);
    const std::string default_text =
        given_default != defaults.end()
            ? given_default->second
            : strategy::OptionText(row.flag_default.is_null() ? row.default_value
                                                              : row.flag_default);
    const std::string text = parser.String(row.flag, default_text, OptionHelp(row));
    try {
      row.apply(*target, strategy::ParseOptionText(row, text));
    } catch (const InvalidArgumentError& e) {
      Fail("--" + row.flag + ": " + e.what());
    }
  }
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  try {
    flags::Flags parser(argc, argv, kUsage);
    f.nproc = parser.Int("nproc", f.nproc, "local ranks to start");
    // --prefetch-depth D: the default of both --forward-prefetch and
    // --backward-prefetch.
    const std::string depth = parser.String(
        "prefetch-depth", "", "units all-gathered ahead in forward and backward (0: none, least "
        "memory): the default of --forward-prefetch and --backward-prefetch");
    std::map<std::string, std::string> defaults;
    if (!depth.empty()) {
      try {
        strategy::ParseOptionText(*strategy::FindOption(strategy::StrategyOptionTable(),
                                                        "forward_prefetch"), depth);
      } catch (const InvalidArgumentError& e) {
        Fail(std::string("--prefetch-depth: ") + e.what());
      }
      defaults = {{"forward_prefetch", depth}, {"backward_prefetch", depth}};
    }
    ReadOptionFlags(parser, strategy::StrategyOptionTable(), &f.options, defaults);
    ReadOptionFlags(parser, strategy::StepOptionTable(), &f.step);
    ReadOptionFlags(parser, strategy::OptimizerOptionTable(), &f.optimizer);
    if (const char* t = std::getenv("FSDP2_TIMEOUT_S")) f.timeout_s = std::atoi(t);
    f.timeout_s = parser.Int("timeout", f.timeout_s,
                             "seconds a rendezvous or collective may take (default: "
                             "FSDP2_TIMEOUT_S or 300)");
    f.steps = parser.Int("steps", f.steps, "optimizer steps");
    f.batch_size =
        parser.Int("batch-size", f.batch_size, "sequences per data-parallel rank and step");
    f.block_size = parser.Int("block-size", f.block_size, "tokens per sequence");
    f.n_layer = parser.Int("n-layer", f.n_layer, "transformer blocks");
    f.n_embd = parser.Int("n-embd", f.n_embd, "embedding width");
    f.n_head = parser.Int("n-head", f.n_head, "attention heads");
    f.data = parser.String("data", f.data, "PATH (a text file), pystdlib or synthetic");
    f.vocab_size = parser.Int("vocab-size", f.vocab_size, "vocabulary of --data synthetic");
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
    f.ckpt_keep = parser.Int("ckpt-keep", f.ckpt_keep,
                             "K > 0: save to ckpt-dir/step-N, keep the newest K");
    f.activation_checkpointing = parser.Int(
        "activation-checkpointing", f.activation_checkpointing,
        "1: recompute each block's activations in backward instead of keeping them");
    f.ac_every = parser.Int("ac-every", f.ac_every,
                            "with --activation-checkpointing 1: every k-th block (1: all)");
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
    f.save_hf_merged = parser.String(
        "save-hf-merged", f.save_hf_merged,
        "DIR: after training, save the --hf-model model with its LoRA adapters merged into "
        "the weights, in transformers' layout");
    f.lora_rank = parser.Int("lora-rank", f.lora_rank,
                             "with --hf-model: train LoRA adapters of this rank (PEFT's r) "
                             "instead of every weight; 0: full fine-tuning");
    f.lora_alpha = parser.Double("lora-alpha", f.lora_alpha,
                                 "LoRA's alpha: the update is scaled by alpha / rank");
    f.lora_dropout = parser.Double("lora-dropout", f.lora_dropout,
                                   "dropout on the adapters' input while training, in [0, 1)");
    f.lora_target_modules = parser.String(
        "lora-target-modules", f.lora_target_modules,
        "the projections that get adapters, of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
        "down_proj");
    f.save_hf_shard_size = parser.String("save-hf-shard-size", f.save_hf_shard_size,
                                         "largest file of --save-hf (5GB, 500MB, 2GiB, bytes)");
    f.save_hf_dtype = parser.String("save-hf-dtype", f.save_hf_dtype,
                                    "float32|bfloat16|float16 for --save-hf (default: as trained)");
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
  if (!f.hf_model.empty() && !fs::exists(fs::path(f.hf_model) / "config.json")) {
    Fail("--hf-model " + f.hf_model + ": has no config.json (a Hugging Face checkpoint "
         "directory, as save_pretrained writes it)");
  }
  if (!f.save_hf.empty() && f.hf_model.empty()) Fail("--save-hf needs --hf-model");
  if (!f.save_hf_merged.empty() && f.hf_model.empty()) Fail("--save-hf-merged needs --hf-model");
  if (f.lora_rank != 0 && f.hf_model.empty()) Fail("--lora-rank needs --hf-model");
  if (f.lora_rank < 0) Fail("--lora-rank must be 0 (no LoRA) or positive");
  if (f.lora_rank > 0) {
    try {
      models::CheckLora(Lora(f));  // what the model would refuse, refused now
    } catch (const std::exception& e) {
      Fail(std::string("--lora-*: ") + e.what());
    }
  }

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
    if (fs::is_directory(f.data) && !strategy::IsPreparedDataset(f.data)) {
      Fail("--data " + f.data + ": is a directory without meta.json; expected a text file, a "
           "token file or a dataset written by python3 -m fsdp2.prepare_data");
    }
    if (strategy::IsPreparedDataset(f.data) && f.hf_model.empty()) {
      Fail("--data " + f.data + ": a prepared dataset (masked targets, packed documents) "
           "trains a --hf-model model");
    }
  }
  if (!f.init_from.empty() && !fs::is_regular_file(f.init_from)) {
    Fail("--init-from " + f.init_from + ": no such file");
  }
  if (!f.resume.empty() && !fs::exists(f.resume) && !fs::exists(f.resume + ".old")) {
    Fail("--resume " + f.resume + ": no such checkpoint");
  }
  if ((f.ckpt_every > 0 || f.ckpt_keep > 0) && f.ckpt_dir.empty()) {
    Fail("--ckpt-every and --ckpt-keep need --ckpt-dir");
  }
  if (f.ckpt_keep < 0) Fail("--ckpt-keep must be positive");
  if (f.max_restarts < 0) Fail("--max-restarts must be 0 or more");
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
    auto gen = at::detail::createCPUGenerator(f.options.seed);
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

// A dataset of fsdp2.prepare_data: its rows {tokens, targets, segments}
// (int32 views of the mapped files), the last 5% and at least one global
// batch held out for validation.
std::pair<strategy::Batch, strategy::Batch> PreparedRows(const Flags& f, int64_t global_batch) {
  const strategy::PreparedDataset data = strategy::MapPreparedDataset(f.data);
  const int64_t rows = data.tokens.size(0);
  const int64_t val_rows = std::max<int64_t>(rows / 20, global_batch);
  if (rows - val_rows < global_batch) {
    throw std::runtime_error("--data " + f.data + ": a prepared dataset of " +
                             std::to_string(rows) + " rows; training and validation need a "
                             "global batch of " + std::to_string(global_batch) +
                             " rows each (prepare more data or lower --batch-size)");
  }
  auto split = [&](int64_t start, int64_t n) {
    return strategy::Batch{data.tokens.narrow(0, start, n), data.labels.narrow(0, start, n),
                           data.segments.narrow(0, start, n)};
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

// The tensor-parallel group's size: --tensor-parallel, or 1 for auto (the
// data-parallel ranks are then all of them).
int TensorParallel(const Flags& f) { return f.options.tensor_parallel_size.value.value_or(1); }

// The option `name`'s value in `f`, as its flag writes it ("bf16").
std::string OptionValue(const Flags& f, const char* name) {
  const auto* row = strategy::FindOption(strategy::StrategyOptionTable(), name);
  return strategy::OptionText(row->get(f.options).value_or(nlohmann::json()));
}

int RunRank(const Flags& f) {
  // The table's options as the flags set them; what the main job sets its
  // own way (the rows' flag_note) below.
  strategy::FSDP2StrategyOptions options = f.options;
  if (f.activation_checkpointing == 1) {
    options.activation_checkpointing = f.ac_every == 1
                                           ? fsdp::ActivationCheckpointing::Full()
                                           : fsdp::ActivationCheckpointing::Selective(f.ac_every);
  }
  if (const char* backend = std::getenv("FSDP2_BACKEND")) {
    options.backend = comm::ParseBackend(backend);
  }
  options.timeout = std::chrono::seconds(f.timeout_s);
  strategy::FSDP2Strategy strategy(options);
  strategy.setup_environment();
  const int threads = ThreadsPerRank(f, *strategy.world());
  at::set_num_threads(threads);
  const int rank = strategy.world()->rank();

  const bool prepared = strategy::IsPreparedDataset(f.data);
  at::Tensor tokens = prepared ? at::Tensor() : LoadTokens(f);
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
    module = std::make_shared<models::GPTModule>(config, models::GPT2AdamW(f.optimizer.lr));
  } else {
    // Built deferred where it can be (no tensor parallelism): no rank ever
    // holds the whole model, on the host or its GPU; parallelize() loads
    // each rank's rows.
    std::optional<fsdp::DeferredInitGuard> deferred;
    if (TensorParallel(f) == 1) {
      deferred.emplace(strategy.tensor_init_context());
    }
    auto llama = models::LlamaModule::FromPretrained(
        f.hf_model, models::GPT2AdamW(f.optimizer.lr), std::nullopt, Lora(f));
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

  const int64_t global_batch = int64_t{strategy.data_parallel_size()} * f.batch_size;
  auto [train_set, val_set] =
      prepared ? PreparedRows(f, global_batch) : Windows(f, tokens, config.vocab_size);
  const int64_t row_tokens = prepared ? train_set[0].size(1) : f.block_size;
  auto train = strategy.process_dataloader(train_set, global_batch);
  auto val = strategy.process_dataloader(val_set, global_batch);

  strategy::TrainerOptions trainer_options;
  trainer_options.max_steps = f.steps;
  trainer_options.max_epochs = 1000000;
  trainer_options.accumulate_grad_batches = f.step.accumulate_grad_batches;
  trainer_options.gradient_clip_val = f.step.gradient_clip_val;
  trainer_options.val_check_interval = f.val_every;
  trainer_options.limit_val_batches = 4;
  trainer_options.log_every_n_steps = f.log_every;
  trainer_options.tokens_per_row = row_tokens;
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
                  options.frozen_params.empty() ? "" : "; frozen: ",
                  OptionValue(f, "frozen_params").c_str());
    }
    std::printf("data: %s (%lld training %s of %lld tokens); %d ranks x %lld "
                "sequences x %d micro-batches; %s on %s; %s\n",
                tokens.defined() || prepared ? f.data.c_str() : "synthetic",
                (long long)train_set[0].size(0),
                prepared ? "rows (prepared: masked targets, packed documents)" : "windows",
                (long long)row_tokens,
                strategy.data_parallel_size(),
                (long long)f.batch_size, f.step.accumulate_grad_batches,
                fsdp::ToString(options.sharding_strategy),
                strategy.fsdp_mesh()->ToString().c_str(), OptionValue(f, "precision").c_str());
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
  std::optional<at::ScalarType> dtype;  // of --save-hf and --save-hf-merged
  if (f.save_hf_dtype == "bfloat16") dtype = at::kBFloat16;
  if (f.save_hf_dtype == "float16") dtype = at::kHalf;
  if (f.save_hf_dtype == "float32") dtype = at::kFloat;
  if (!f.save_hf.empty()) {
    strategy.save_hf_checkpoint(f.save_hf, checkpoint::ParseShardSize(f.save_hf_shard_size),
                                dtype);
    if (rank == 0) {
      std::printf("saved %s (%s)\n", f.save_hf.c_str(),
                  f.lora_rank > 0 ? "LoRA adapters, PEFT's layout" : "Hugging Face layout");
    }
  }
  if (!f.save_hf_merged.empty()) {
    strategy.save_hf_merged_checkpoint(
        f.save_hf_merged, checkpoint::ParseShardSize(f.save_hf_shard_size), dtype);
    if (rank == 0) {
      std::printf("saved %s (Hugging Face layout, adapters merged)\n", f.save_hf_merged.c_str());
    }
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
  const int tp = TensorParallel(f);
  const int shard_group_size = f.options.shard_group_size;
  if (f.nproc % tp != 0) {
    Fail("--tensor-parallel must divide --nproc (" + std::to_string(f.nproc) + "), got " +
         std::to_string(tp));
  }
  if (shard_group_size > 0 && (f.nproc / tp) % shard_group_size != 0) {
    Fail("--shard-group-size must divide the " + std::to_string(f.nproc / tp) +
         " data-parallel ranks, got " + std::to_string(shard_group_size));
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
  } catch (const c10::OutOfMemoryError& e) {
    // Named, with what to change: LibTorch's text says only what failed.
    std::cerr << "train: out of memory: " << e.what_without_backtrace()
              << "\ntrain: the step does not fit on this device; try --cpu-offload 1 (shards, "
                 "gradients and optimizer state in host memory), --activation-checkpointing 1, "
                 "a smaller --batch-size, or more ranks\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "train: " << e.what() << "\n";
    return 1;
  }
}
