// Hugging Face Llama-family checkpoints through FSDP2Strategy, against
// transformers itself (issue #27). tests/hf/hf_reference.py makes tiny
// random Llama (Llama 3 scaling, every bias, nine shards), Mistral (sliding
// window shorter than the sequence), Qwen2 (tied embeddings) and
// bfloat16-stored checkpoints with transformers, and records transformers'
// logits and its losses over AdamW steps (all parameters, and with half of
// the model frozen). fsdp2 loads each on 1-4 ranks, every sharding
// strategy, tensor parallelism and deferred initialisation, and must give
// the same logits (rel 1e-5) and losses (rel 1e-4); what it saves must load
// in transformers with its own logits; broken checkpoints must fail before
// anything is trained, naming the tensor; and loading must never hold the
// model on one rank.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/checkpoint/hf_checkpoint.h"
#include "core/checkpoint/safetensors.h"
#include "core/fsdp/fsdp_options.h"
#include "core/models/gpt_module.h"
#include "core/models/llama.h"
#include "core/models/llama_module.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/fsdp_controls.h"
#include "tests/harness/multi_process.h"

namespace fsdp2 {
namespace testing {
namespace {
namespace fs = std::filesystem;
using checkpoint::SafetensorsFile;

constexpr int kSteps = 3;
constexpr const char* kFrozen = "model.embed_tokens.*,model.layers.0.*,*norm*";

strategy::OptimizerOptions AdamW() { return models::GPT2AdamW(1e-3); }

// "FULL_SHARD", "HYBRID_SHARD:2" (shard groups of 2), ... and tp size;
// "+ac" after the strategy: activation checkpointing of every layer.
strategy::FSDP2StrategyOptions Options(std::string sharding, int tp) {
  strategy::FSDP2StrategyOptions o;
  o.mp_policy = fsdp::MixedPrecisionPolicy{};
  o.device = strategy::DeviceSpec::Cpu();
  o.timeout = std::chrono::seconds(60);
  const auto plus = sharding.find("+ac");
  if (plus != std::string::npos) {
    o.activation_checkpointing = fsdp::ActivationCheckpointing::Full();
    sharding.erase(plus, 3);
  }
  const auto colon = sharding.find(':');
  o.sharding_strategy = fsdp::ParseShardingStrategy(sharding.substr(0, colon));
  if (colon != std::string::npos) o.shard_group_size = std::stoi(sharding.substr(colon + 1));
  if (tp > 1) o.tensor_parallel_size = strategy::ParallelSize::Of(tp);
  return o;
}

int64_t RssBytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::strlen(field))) * 1024;
  }
  return -1;
}

// args: checkpoint, data, sharding, tp, deferred (0/1), frozen globs ("-"),
// steps, save dir ("-"), save max shard size.
// Rank 0 writes result.safetensors: logits of the eval tokens before and
// after training, and the mean losses.
FSDP2_SCENARIO(hf_run) {
  const std::string path = args.at(0), data_path = args.at(1);
  const int tp = std::stoi(args.at(3));
  const bool deferred = args.at(4) == "1";
  const std::string frozen = args.at(5) == "-" ? "" : args.at(5);
  const int steps = std::stoi(args.at(6));
  auto options = Options(args.at(2), tp);
  options.frozen_params = strategy::SplitNames(frozen);
  strategy::FSDP2Strategy s(options);
  s.setup_environment();
  std::shared_ptr<models::LlamaModule> m;
  if (deferred) {
    auto init = s.tensor_init_context();
    m = models::LlamaModule::FromPretrained(path, AdamW());
  } else {
    m = models::LlamaModule::FromPretrained(path, AdamW());
  }
  s.connect(m);
  s.parallelize();
  const int rank = s.world()->rank();
  // The frozen parameters' shards, to check that nothing touches them.
  std::vector<std::pair<at::Tensor, at::Tensor>> frozen_params;
  for (const auto& p : m->module()->named_parameters()) {
    if (!p.value().requires_grad()) frozen_params.emplace_back(p.value(), p.value().clone());
  }
  if (frozen.empty() != frozen_params.empty()) throw std::runtime_error("frozen_params not applied");
  int64_t trained_bytes = 0, shard_bytes = 0;
  for (const auto& p : m->module()->parameters()) {
    shard_bytes += p.numel() * p.element_size();
    if (p.requires_grad()) trained_bytes += p.numel() * p.element_size();
  }
  int64_t grad_bytes = -1, optimizer_bytes = -1;
  const SafetensorsFile data(data_path);
  const at::Tensor eval = data.load("eval");
  at::Tensor before;
  {
    torch::NoGradGuard no_grad;
    before = m->logits(eval);
  }
  const at::Tensor inputs = data.load("inputs"), targets = data.load("targets");
  const int64_t rows = inputs.size(1) / s.data_parallel_size();
  const int64_t first = rows * s.data_parallel_rank();
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    strategy::Batch batch = {inputs[i].narrow(0, first, rows), targets[i].narrow(0, first, rows)};
    at::Tensor loss = s.training_step(batch, i);
    s.backward(loss);
    for (const auto& f : frozen_params) {
      if (f.first.grad().defined()) throw std::runtime_error("a frozen parameter got a gradient");
    }
    grad_bytes = s.memory_stats().sharded_grad_bytes;
    s.optimizer_step();
    optimizer_bytes = s.memory_stats().optimizer_state_bytes;
    losses.push_back(s.reduce(loss).item<double>());
  }
  for (const auto& f : frozen_params) {
    if (!at::equal(f.first, f.second)) throw std::runtime_error("a frozen parameter changed");
    if (s.optimizer().state().count(f.first.unsafeGetTensorImpl()) != 0) {
      throw std::runtime_error("a frozen parameter has optimizer state");
    }
  }
  at::Tensor after;
  {
    torch::NoGradGuard no_grad;
    after = m->logits(eval);
  }
  if (args.at(7) != "-") {
    s.save_hf_checkpoint(args.at(7), checkpoint::ParseShardSize(args.at(8)));
  }
  if (rank == 0) {
    checkpoint::WriteSafetensors(
        WorkerOutDir() + "/result.safetensors",
        {{"logits", before},
         {"after", after},
         {"losses", at::tensor(losses, at::kDouble)},
         // This rank's bytes: shards, trained shards, their gradients after
         // a backward, the optimizer's state.
         {"memory", at::tensor(std::vector<int64_t>{shard_bytes, trained_bytes, grad_bytes,
                                                    optimizer_bytes})}});
  }
}

// args: checkpoint. Each rank writes the error parallelize() threw.
FSDP2_SCENARIO(hf_load_error) {
  strategy::FSDP2Strategy s(Options("FULL_SHARD", 1));
  s.setup_environment();
  std::string message = "no error";
  try {
    std::shared_ptr<models::LlamaModule> m;
    {
      auto init = s.tensor_init_context();
      m = models::LlamaModule::FromPretrained(args.at(0), AdamW());
    }
    s.connect(m);
    s.parallelize();
  } catch (const std::exception& e) {
    message = e.what();
  }
  std::ofstream(WorkerOutDir() + "/error" + std::to_string(s.world()->rank()) + ".txt") << message;
}

// args: checkpoint. Each rank writes its peak RSS growth over
// parallelize() (materialising, sharding and loading) and its shard bytes.
FSDP2_SCENARIO(hf_load_memory) {
  strategy::FSDP2Strategy s(Options("FULL_SHARD", 1));
  s.setup_environment();
  std::shared_ptr<models::LlamaModule> m;
  {
    auto init = s.tensor_init_context();
    m = models::LlamaModule::FromPretrained(args.at(0), AdamW());
  }
  s.connect(m);
  // Peak RSS from here (Linux: "5" resets VmHWM to the current RSS).
  std::ofstream("/proc/self/clear_refs") << "5";
  const int64_t rss = RssBytes("VmRSS:");
  s.parallelize();
  const int64_t peak = RssBytes("VmHWM:");
  int64_t shard_bytes = 0;
  for (const auto& p : m->module()->parameters()) shard_bytes += p.numel() * p.element_size();
  // Loading alone, into the sharded model.
  std::ofstream("/proc/self/clear_refs") << "5";
  const int64_t before_load = RssBytes("VmRSS:");
  s.load_model_state_dict(args.at(0));
  const int64_t load_peak = RssBytes("VmHWM:");
  std::ofstream(WorkerOutDir() + "/memory" + std::to_string(s.world()->rank()) + ".txt")
      << (peak - rss) << " " << shard_bytes << " " << (load_peak - before_load);
}

// ---- the test side ----

std::string Python() { return FSDP2_PYTHON; }  // @venv//:python_path

// Tests run in their runfiles' workspace directory.
std::string Script() { return "tests/hf/hf_reference.py"; }

void RunPython(const std::string& args) {
  const std::string cmd = Python() + " " + Script() + " " + args + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// transformers' checkpoints and results, made once for the whole binary.
class HfLlama : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::string(std::getenv("TEST_TMPDIR")) + "/hf");
    fs::remove_all(*dir_);
    const std::string cmd =
        Python() + " " + Script() + " prepare " + *dir_ + " > " + *dir_ + ".log 2>&1";
    prepared_ = std::system(cmd.c_str()) == 0;
  }
  void SetUp() override {
    ASSERT_TRUE(prepared_) << "hf_reference.py prepare failed:\n" << ReadFile(*dir_ + ".log");
  }
  static std::string Dir(const std::string& name) { return *dir_ + "/" + name; }
  static std::string Data() { return Dir("data.safetensors"); }

  struct Run {
    int world = 1;
    std::string sharding = "FULL_SHARD";
    int tp = 1;
    bool deferred = true;
    std::string frozen;
    int steps = kSteps;
    std::string save, shard_size = "5GB";
  };
  // Runs fsdp2 on `checkpoint`; its rank 0's result.safetensors.
  static std::string Launch(const std::string& checkpoint, const Run& r) {
    LaunchResult result = LaunchScenario(
        "hf_run", r.world,
        {checkpoint, Data(), r.sharding, std::to_string(r.tp), r.deferred ? "1" : "0",
         r.frozen.empty() ? "-" : r.frozen, std::to_string(r.steps),
         r.save.empty() ? "-" : r.save, r.shard_size});
    EXPECT_TRUE(result.ok()) << result.Describe();
    return result.out_dir + "/result.safetensors";
  }

  static double RelDiff(const at::Tensor& a, const at::Tensor& b) {
    return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
           b.to(at::kDouble).abs().max().item<double>();
  }
  // fsdp2's run against transformers' reference file.
  static void ExpectEqual(const std::string& result, const std::string& reference,
                          const std::string& what, bool losses = true) {
    if (!fs::exists(result)) return;  // the launch failed (reported)
    const SafetensorsFile got(result), want(reference);
    const double logits = RelDiff(got.load("logits"), want.load("logits"));
    EXPECT_LE(logits, 1e-5) << what << ": logits";
    if (!losses) return;
    const at::Tensor l = got.load("losses"), w = want.load("losses");
    std::printf("%-40s logits rel %.1e  losses rel %.1e  trained logits rel %.1e\n",
                what.c_str(), logits, RelDiff(l, w), RelDiff(got.load("after"), want.load("after")));
    ASSERT_EQ(l.numel(), w.numel()) << what;
    for (int64_t i = 0; i < l.numel(); ++i) {
      // The issue asks 1e-4; fsdp2 gives 2e-7.
      EXPECT_NEAR(l[i].item<double>(), w[i].item<double>(), 1e-5 * w[i].item<double>())
          << what << ": loss of step " << i;
    }
    EXPECT_LE(RelDiff(got.load("after"), want.load("after")), 1e-4) << what << ": trained logits";
  }

  // Memory statistics show what freezing saves: gradients and AdamW's
  // state (two tensors a parameter) only for the trained shards.
  static void ExpectFrozenMemory(const std::string& result, const std::string& what) {
    if (!fs::exists(result)) return;
    const at::Tensor m = SafetensorsFile(result).load("memory");
    const int64_t shards = m[0].item<int64_t>(), trained = m[1].item<int64_t>();
    std::printf("%-40s shards %lld B, trained %lld B, gradients %lld B, AdamW state %lld B\n",
                what.c_str(), (long long)shards, (long long)trained,
                (long long)m[2].item<int64_t>(), (long long)m[3].item<int64_t>());
    EXPECT_LT(trained, shards) << what;
    EXPECT_EQ(m[2].item<int64_t>(), trained) << what << ": gradient bytes";
    EXPECT_EQ(m[3].item<int64_t>(), 2 * trained) << what << ": optimizer state bytes";
  }

  static std::string* dir_;
  static bool prepared_;
};
std::string* HfLlama::dir_ = nullptr;
bool HfLlama::prepared_ = false;

TEST_F(HfLlama, LogitsAndTrainingEqualTransformers) {
  for (const std::string name : {"llama", "mistral", "qwen2", "llama_bf16"}) {
    for (int world : {1, 2, 3}) {
      Run r;
      r.world = world;
      ExpectEqual(Launch(Dir(name), r), Dir(name + ".ref.safetensors"),
                  name + " on " + std::to_string(world) + " rank(s)");
    }
  }
  Run four;
  four.world = 4;
  ExpectEqual(Launch(Dir("llama"), four), Dir("llama.ref.safetensors"), "llama on 4 ranks");
}

TEST_F(HfLlama, EveryShardingStrategyTensorParallelismAndEagerInit) {
  for (const std::string sharding : {"SHARD_GRAD_OP", "NO_SHARD"}) {
    Run r;
    r.world = 2;
    r.sharding = sharding;
    ExpectEqual(Launch(Dir("llama"), r), Dir("llama.ref.safetensors"), sharding);
  }
  Run hybrid;
  hybrid.world = 4;
  hybrid.sharding = "HYBRID_SHARD:2";
  ExpectEqual(Launch(Dir("qwen2"), hybrid), Dir("qwen2.ref.safetensors"), "HYBRID_SHARD");
  Run tp;  // 2 heads and 1 key/value head per rank; built eagerly
  tp.world = 2;
  tp.tp = 2;
  tp.deferred = false;
  ExpectEqual(Launch(Dir("llama"), tp), Dir("llama.ref.safetensors"), "tp = 2");
  Run dp_tp;
  dp_tp.world = 4;
  dp_tp.tp = 2;
  dp_tp.deferred = false;
  ExpectEqual(Launch(Dir("qwen2"), dp_tp), Dir("qwen2.ref.safetensors"), "dp 2 x tp 2");
  Run ac;  // every decoder layer recomputed in backward
  ac.world = 3;
  ac.sharding = "FULL_SHARD+ac";
  ExpectEqual(Launch(Dir("mistral"), ac), Dir("mistral.ref.safetensors"),
              "activation checkpointing");
  Run fp16;  // a float16 file, converted as it loads
  fp16.world = 2;
  ExpectEqual(Launch(Dir("llama_fp16"), fp16), Dir("llama_fp16.ref.safetensors"), "fp16 file");
}

TEST_F(HfLlama, FrozenParametersTrainLikeTransformers) {
  // The scenario also checks that frozen parameters get no gradient, no
  // optimizer state and do not change.
  for (const std::string name : {"llama", "qwen2"}) {
    for (int world : {1, 2, 4}) {
      Run r;
      r.world = world;
      r.frozen = kFrozen;
      const std::string what = name + " frozen on " + std::to_string(world) + " rank(s)";
      const std::string result = Launch(Dir(name), r);
      ExpectEqual(result, Dir(name + ".frozen.ref.safetensors"), what);
      ExpectFrozenMemory(result, what);
    }
  }
  Run sgo;
  sgo.world = 3;
  sgo.sharding = "SHARD_GRAD_OP";
  sgo.frozen = kFrozen;
  ExpectEqual(Launch(Dir("llama"), sgo), Dir("llama.frozen.ref.safetensors"),
              "llama frozen, SHARD_GRAD_OP on 3 ranks");
}

TEST_F(HfLlama, SavedCheckpointsLoadInTransformersAndBack) {
  // Trained on 2 (3) ranks, saved in shards of at most 40 KB (one file).
  Run sharded;
  sharded.world = 2;
  sharded.save = Dir("saved_llama");
  sharded.shard_size = "40KB";
  const std::string trained_llama = Launch(Dir("llama"), sharded);
  Run single;
  single.world = 3;
  single.save = Dir("saved_qwen2");
  const std::string trained_qwen2 = Launch(Dir("qwen2"), single);
  Run tp;  // gathered from dp 2 x tp 2 blocks
  tp.world = 4;
  tp.tp = 2;
  tp.deferred = false;
  tp.save = Dir("saved_tp");
  tp.shard_size = "40KB";
  const std::string trained_tp = Launch(Dir("llama"), tp);
  ASSERT_TRUE(fs::exists(Dir("saved_llama/model.safetensors.index.json")));
  ASSERT_TRUE(fs::exists(Dir("saved_qwen2/model.safetensors")));
  RunPython("check " + Data() + " " + Dir("saved_llama") + " " + Dir("saved_qwen2") + " " +
            Dir("saved_tp"));
  // transformers' logits of the saved checkpoints are fsdp2's after training.
  for (const auto& [saved, trained] :
       std::map<std::string, std::string>{{"saved_llama", trained_llama},
                                          {"saved_qwen2", trained_qwen2},
                                          {"saved_tp", trained_tp}}) {
    const at::Tensor want = SafetensorsFile(trained).load("after");
    const double theirs =
        RelDiff(SafetensorsFile(Dir(saved + ".logits.safetensors")).load("logits"), want);
    std::printf("%-40s transformers' logits of the save rel %.1e\n", saved.c_str(), theirs);
    EXPECT_LE(theirs, 1e-5) << saved;
    // And fsdp2 loads them back on another number of ranks.
    Run reload;
    reload.world = saved == "saved_llama" ? 3 : 2;
    reload.steps = 0;
    const std::string again = Launch(Dir(saved), reload);
    if (fs::exists(again)) {
      EXPECT_LE(RelDiff(SafetensorsFile(again).load("logits"), want), 1e-6) << saved;
    }
  }
  // A second save replaces the first; a directory with other files is refused.
  Run resave = sharded;
  resave.steps = 0;
  Launch(Dir("saved_llama"), resave);
  EXPECT_TRUE(fs::exists(Dir("saved_llama/model.safetensors.index.json")));
  std::ofstream(Dir("saved_qwen2/notes.txt")) << "mine";
  LaunchResult refused = LaunchScenario(
      "hf_run", 2, {Dir("qwen2"), Data(), "FULL_SHARD", "1", "1", "-", "0", Dir("saved_qwen2"), "5GB"});
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.ranks[0].log.find("holds 'notes.txt'"), std::string::npos)
      << refused.ranks[0].log;
  EXPECT_TRUE(fs::exists(Dir("saved_qwen2/model.safetensors")));
}

// A copy of checkpoint `from` as `to`, with `edit` applied to the tensors
// of its single file.
void RewriteSingle(const std::string& from, const std::string& to,
                   const std::function<void(checkpoint::NamedTensors&)>& edit) {
  fs::remove_all(to);
  fs::copy(from, to);
  const std::string file = to + "/model.safetensors";
  checkpoint::NamedTensors tensors;
  {
    const SafetensorsFile f(file);
    for (const auto& item : f.tensors()) tensors.emplace_back(item.first, f.load(item.first));
  }
  edit(tensors);
  checkpoint::WriteSafetensors(file, tensors, {{"format", "pt"}});
}

TEST_F(HfLlama, BrokenCheckpointsFailNamingTheTensor) {
  std::vector<std::pair<std::string, std::string>> cases;  // dir, expected text
  RewriteSingle(Dir("qwen2"), Dir("bad_shape"), [](checkpoint::NamedTensors& t) {
    for (auto& item : t) {
      if (item.first == "model.norm.weight") item.second = item.second.narrow(0, 0, 31).clone();
    }
  });
  cases.push_back({Dir("bad_shape"), "tensor 'model.norm.weight' has shape [31] but the model's "
                                     "parameter is [32]"});
  RewriteSingle(Dir("qwen2"), Dir("missing"), [](checkpoint::NamedTensors& t) {
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](const auto& item) {
                             return item.first == "model.layers.1.mlp.up_proj.weight";
                           }),
            t.end());
  });
  cases.push_back({Dir("missing"), "has no tensor 'model.layers.1.mlp.up_proj.weight'"});
  RewriteSingle(Dir("qwen2"), Dir("extra"), [](checkpoint::NamedTensors& t) {
    t.emplace_back("lm_head.weight", at::zeros({96, 32}));
  });
  cases.push_back({Dir("extra"), "has tensor 'lm_head.weight' (in model.safetensors), which the "
                                 "model does not have (the config ties"});
  // A shard cut short.
  fs::remove_all(Dir("truncated"));
  fs::copy(Dir("llama"), Dir("truncated"));
  const std::string shard = Dir("truncated/model-00004-of-00009.safetensors");
  fs::resize_file(shard, fs::file_size(shard) - 100);
  cases.push_back({Dir("truncated"), "model-00004-of-00009.safetensors"});
  // An index naming a file that is not there.
  fs::remove_all(Dir("no_file"));
  fs::copy(Dir("llama"), Dir("no_file"));
  fs::remove(Dir("no_file/model-00002-of-00009.safetensors"));
  cases.push_back({Dir("no_file"), "model-00002-of-00009.safetensors"});
  // No weights at all.
  fs::create_directories(Dir("empty"));
  fs::copy_file(Dir("qwen2/config.json"), Dir("empty/config.json"),
                fs::copy_options::overwrite_existing);
  cases.push_back({Dir("empty"), "no model.safetensors and no model.safetensors.index.json"});
  for (const auto& [dir, text] : cases) {
    LaunchResult r = LaunchScenario("hf_load_error", 2, {dir});
    ASSERT_TRUE(r.ok()) << r.Describe();
    for (int rank = 0; rank < 2; ++rank) {
      const std::string error =
          ReadFile(r.out_dir + "/error" + std::to_string(rank) + ".txt");
      EXPECT_NE(error.find(text), std::string::npos) << dir << " rank " << rank << ": " << error;
    }
  }
}

TEST_F(HfLlama, LoadingHoldsOneShardPerRank) {
  // A 16M-parameter float32 Llama (64 MB; the embedding and the head 6 MB
  // each), written here as a Hugging Face checkpoint in bfloat16.
  const std::string dir = Dir("big");
  fs::create_directories(dir);
  const std::string config = R"({"model_type": "llama", "vocab_size": 4000, "hidden_size": 384,
      "intermediate_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 4,
      "num_key_value_heads": 2, "dtype": "bfloat16"})";
  std::ofstream(dir + "/config.json") << config;
  const models::HfLlamaConfig c = models::ParseHfConfig(config, "big");
  checkpoint::NamedTensors tensors;
  int64_t model_bytes = 0, largest = 0;
  for (const auto& [name, shape] : models::LlamaParameterShapes(c)) {
    tensors.emplace_back(name, at::randn(shape).to(at::kBFloat16));
    const int64_t bytes = c10::multiply_integers(shape) * 4;  // as float32 parameters
    model_bytes += bytes;
    largest = std::max(largest, bytes);
  }
  checkpoint::WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  tensors.clear();
  LaunchResult r = LaunchScenario("hf_load_memory", 4, {dir});
  ASSERT_TRUE(r.ok()) << r.Describe();
  for (int rank = 0; rank < 4; ++rank) {
    const std::vector<double> m = ReadNumbers(r.out_dir + "/memory" + std::to_string(rank) + ".txt");
    ASSERT_EQ(m.size(), 3u);
    // parallelize(): its shard, plus what materialising replays at full
    // size (one parameter at a time) and loading reads (one parameter's
    // rows), plus 8 MB of allocator slack. A rank that held the model would
    // need model_bytes.
    const double bound = m[1] + 2 * largest + 8e6;
    // Loading into the sharded model: at most one parameter's worth.
    const double load_bound = largest + 2e6;
    std::printf("rank %d: peak RSS +%.1f MB over parallelize() (shard %.1f MB, model %.1f MB, "
                "bound %.1f MB); +%.1f MB over a second load (bound %.1f MB)\n",
                rank, m[0] / 1e6, m[1] / 1e6, model_bytes / 1e6, bound / 1e6, m[2] / 1e6,
                load_bound / 1e6);
    EXPECT_LE(m[0], bound) << "rank " << rank << ": peak RSS grew by " << m[0] / 1e6
                           << " MB building and loading a " << model_bytes / 1e6
                           << " MB model; shard " << m[1] / 1e6 << " MB";
    EXPECT_LE(m[2], load_bound) << "rank " << rank << ": loading took " << m[2] / 1e6 << " MB";
    EXPECT_LT(bound, 0.75 * model_bytes);  // the bound itself means something
  }
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
