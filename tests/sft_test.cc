// Supervised fine-tuning as people do it (issue #46), against transformers
// and peft. tests/hf/sft_reference.py makes a tiny Llama with a word-level
// tokenizer and a chat template, chats, and their datasets through
// fsdp2.prepare_data (packed and one chat a row), and fine-tunes the model
// on the packed dataset's global batches with transformers (every weight)
// and with peft (LoRA on q_proj, v_proj and down_proj), each document run
// alone and the loss summed over every learned target of the global batch
// over their number. fsdp2 trains on the same rows on 1-3 ranks, with
// gradient accumulation too, and must give the same step losses (1e-5):
// masked targets, packed documents and the global mean over items. Its
// saves must load in transformers and peft with the reference's logits,
// with the tokenizer and generation config, and generate; the packed
// dataset's loss must be the unpacked one's; LoRA must leave the base frozen
// with optimizer state for the adapters only.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/checkpoint/safetensors.h"
#include "core/common/error.h"
#include "core/models/gpt_module.h"
#include "core/models/llama_module.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/micro_batch_step.h"
#include "core/strategy/token_dataset.h"
#include "tests/harness/multi_process.h"

namespace fsdp2 {
namespace testing {
namespace {
namespace fs = std::filesystem;

constexpr int kSteps = 3;          // sft_reference.py's STEPS
constexpr int64_t kGlobalRows = 6;  // its GLOBAL_ROWS
constexpr double kLr = 1e-2;        // its LR

models::LoraOptions Lora() {
  models::LoraOptions lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  return lora;
}

strategy::FSDP2StrategyOptions Options() {
  strategy::FSDP2StrategyOptions o;
  o.mp_policy = fsdp::MixedPrecisionPolicy{};
  o.device = strategy::DeviceSpec::Cpu();
  o.timeout = std::chrono::seconds(60);
  return o;
}

// args: base checkpoint, prepared dataset, "full" or "lora", micro-batches
// per step, LoRA's initial adapters, save dir ("-"), merged save dir ("-").
// Rank 0 writes losses.txt (the reduced step losses) and memory.txt
// (shard, trained and optimizer-state bytes of this rank).
FSDP2_SCENARIO(sft_run) {
  const std::string base = args.at(0), data = args.at(1);
  const bool lora = args.at(2) == "lora";
  const int accumulate = std::stoi(args.at(3));
  strategy::FSDP2Strategy s(Options());
  s.setup_environment();
  std::shared_ptr<models::LlamaModule> m;
  {
    auto init = s.tensor_init_context();  // adapters drawn deferred too
    m = models::LlamaModule::FromPretrained(base, models::GPT2AdamW(kLr), std::nullopt,
                                            lora ? Lora() : models::LoraOptions{});
  }
  s.connect(m);
  s.parallelize();
  if (lora) s.load_model_state_dict(args.at(4), /*strict=*/false);  // peft's draw
  const strategy::PreparedDataset rows = strategy::MapPreparedDataset(data);
  const int64_t local = kGlobalRows / s.data_parallel_size();
  const int64_t first = local * s.data_parallel_rank();
  std::vector<double> losses;
  for (int i = 0; i < kSteps; ++i) {
    const int64_t at = i * kGlobalRows + first;
    const strategy::Batch batch = {rows.tokens.narrow(0, at, local),
                                   rows.labels.narrow(0, at, local),
                                   rows.segments.narrow(0, at, local)};
    losses.push_back(strategy::TrainingStepOnRows(s, batch, i, accumulate).loss);
  }
  int64_t shard_bytes = 0, trained_bytes = 0;
  for (const auto& p : m->module()->parameters()) {
    shard_bytes += p.numel() * p.element_size();
    if (p.requires_grad()) trained_bytes += p.numel() * p.element_size();
  }
  const int64_t optimizer_bytes = s.memory_stats().optimizer_state_bytes;
  if (args.at(5) != "-") s.save_hf_checkpoint(args.at(5));
  if (args.at(6) != "-") s.save_hf_merged_checkpoint(args.at(6));
  if (s.world()->rank() == 0) {
    std::ofstream out(WorkerOutDir() + "/losses.txt");
    out.precision(17);
    for (double l : losses) out << l << "\n";
    std::ofstream(WorkerOutDir() + "/memory.txt")
        << shard_bytes << " " << trained_bytes << " " << optimizer_bytes;
  }
}

// args: base checkpoint, prepared dataset. Rank 0 writes the loss of every
// row at once (the mean over every learned target) in loss.txt.
FSDP2_SCENARIO(sft_eval) {
  strategy::FSDP2Strategy s(Options());
  s.setup_environment();
  auto m = models::LlamaModule::FromPretrained(args.at(0), models::GPT2AdamW(kLr));
  s.connect(m);
  s.parallelize();
  const strategy::PreparedDataset rows = strategy::MapPreparedDataset(args.at(1));
  torch::NoGradGuard no_grad;
  const double loss = m->loss({rows.tokens, rows.labels, rows.segments}).item<double>();
  if (s.world()->rank() == 0) {
    std::ofstream out(WorkerOutDir() + "/loss.txt");
    out.precision(17);
    out << loss;
  }
}

// ---- the test side ----

std::string Python() { return FSDP2_PYTHON; }  // @venv//:python_path
// Tests run in their runfiles' workspace directory.
std::string Script() { return "tests/hf/sft_reference.py"; }
std::string PrepareData() { return "bindings/python/fsdp2/prepare_data.py"; }

std::vector<double> ReferenceLosses(const std::string& json_path) {
  // {"losses": [a, b, c]}: the numbers between the brackets.
  std::string text = ReadFile(json_path);
  const auto open = text.find('['), close = text.find(']');
  std::vector<double> out;
  if (open == std::string::npos || close == std::string::npos) return out;
  std::stringstream in(text.substr(open + 1, close - open - 1));
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stod(item));
  return out;
}

class Sft : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::string(std::getenv("TEST_TMPDIR")) + "/sft");
    fs::remove_all(*dir_);
    const std::string cmd = Python() + " " + Script() + " make " + *dir_ + " " + PrepareData() +
                            " > " + *dir_ + ".log 2>&1";
    made_ = std::system(cmd.c_str()) == 0;
  }
  void SetUp() override {
    ASSERT_TRUE(made_) << "sft_reference.py make failed:\n" << ReadFile(*dir_ + ".log");
  }
  static std::string Dir(const std::string& name) { return *dir_ + "/" + name; }

  // fsdp2's run: its out dir (losses.txt, memory.txt).
  static std::string Train(const std::string& mode, int world, int accumulate,
                           const std::string& save = "-", const std::string& merged = "-") {
    LaunchResult r = LaunchScenario(
        "sft_run", world,
        {Dir("base"), Dir("packed"), mode, std::to_string(accumulate),
         Dir("lora_init.safetensors"), save, merged});
    EXPECT_TRUE(r.ok()) << r.Describe();
    return r.out_dir;
  }

  static void ExpectLosses(const std::string& out, const std::string& reference,
                           const std::string& what) {
    const std::vector<double> got = ReadNumbers(out + "/losses.txt");
    const std::vector<double> want = ReferenceLosses(Dir(reference));
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << what;
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps)) << what;
    for (int i = 0; i < kSteps; ++i) {
      std::printf("%-36s step %d: fsdp2 %.9f reference %.9f\n", what.c_str(), i, got[i],
                  want[i]);
      EXPECT_NEAR(got[i], want[i], 1e-5) << what << ": loss of step " << i;
    }
    // The steps trained: the loss moved.
    EXPECT_GT(std::abs(got[kSteps - 1] - got[0]), 1e-3) << what;
  }

  static std::string* dir_;
  static bool made_;
};
std::string* Sft::dir_ = nullptr;
bool Sft::made_ = false;

TEST_F(Sft, FullFineTuneEqualsTransformersOnMaskedPackedBatches) {
  for (int world : {1, 2, 3}) {
    ExpectLosses(Train("full", world, 1), "ref_full.json",
                 "full, " + std::to_string(world) + " rank(s)");
  }
  // Micro-batches hold different numbers of learned targets: weighted by
  // them, not averaged.
  ExpectLosses(Train("full", 1, 3), "ref_full.json", "full, 1 rank, 3 micro-batches");
  ExpectLosses(Train("full", 2, 3), "ref_full.json", "full, 2 ranks, 3 micro-batches");
}

TEST_F(Sft, LoraEqualsPeftAndTrainsOnlyTheAdapters) {
  for (int world : {1, 2, 3}) {
    const std::string out = Train("lora", world, 1);
    ExpectLosses(out, "ref_lora.json", "lora, " + std::to_string(world) + " rank(s)");
    const std::vector<double> m = ReadNumbers(out + "/memory.txt");
    ASSERT_EQ(m.size(), 3u);
    // AdamW keeps two tensors per trained parameter, and only the adapters
    // train: a small share of the shards.
    EXPECT_EQ(m[2], 2 * m[1]) << "optimizer state for the adapters only";
    EXPECT_LT(m[1], 0.2 * m[0]) << "trained bytes " << m[1] << " of " << m[0];
    EXPECT_GT(m[1], 0);
  }
}

TEST_F(Sft, SavesLoadInTransformersAndPeftAndGenerate) {
  const std::string full = Dir("save_full"), adapter = Dir("save_adapter"),
                    merged = Dir("save_merged");
  Train("full", 2, 1, full);
  Train("lora", 2, 1, adapter, merged);
  EXPECT_TRUE(fs::exists(adapter + "/adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(adapter + "/model.safetensors")) << "the base is not saved with LoRA";
  EXPECT_TRUE(fs::exists(merged + "/model.safetensors"));
  const std::string cmd = Python() + " " + Script() + " check " + *dir_ + " --full " + full +
                          " --adapter " + adapter + " --merged " + merged + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST_F(Sft, PackedLossEqualsUnpacked) {
  LaunchResult packed = LaunchScenario("sft_eval", 1, {Dir("base"), Dir("packed")});
  ASSERT_TRUE(packed.ok()) << packed.Describe();
  const double p = ReadNumbers(packed.out_dir + "/loss.txt").at(0);
  LaunchResult unpacked = LaunchScenario("sft_eval", 1, {Dir("base"), Dir("unpacked")});
  ASSERT_TRUE(unpacked.ok()) << unpacked.Describe();
  const double u = ReadNumbers(unpacked.out_dir + "/loss.txt").at(0);
  std::printf("loss over every chat: packed %.9f, one chat a row %.9f\n", p, u);
  EXPECT_NEAR(p, u, 1e-5 * u);
  // Packing put several chats in a row.
  const auto pr = strategy::MapPreparedDataset(Dir("packed"));
  const auto ur = strategy::MapPreparedDataset(Dir("unpacked"));
  EXPECT_LT(pr.tokens.size(0), ur.tokens.size(0));
  EXPECT_GT(pr.segments.max().item<int64_t>(), 0);
}

TEST_F(Sft, PreparedLoaderAndBadInputs) {
  // The loader gives {tokens, targets, segments} rows of seq_len.
  strategy::FSDP2Strategy s(Options());
  s.setup_environment();
  const strategy::TokenLoader loader =
      strategy::MakeTokenLoader(s, Dir("packed"), strategy::TokenDatasetOptions{}, 2);
  EXPECT_TRUE(loader.prepared());
  const strategy::Batch b = loader.batch(0);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].size(1), loader.block_size());
  EXPECT_EQ(b[1].scalar_type(), at::kLong);
  EXPECT_TRUE(b[1].eq(-100).any().item<bool>()) << "prompts are masked";
  // A data file cut short is refused naming it.
  const std::string cut = Dir("cut");
  fs::remove_all(cut);
  fs::copy(Dir("packed"), cut);
  fs::resize_file(cut + "/labels.bin", fs::file_size(cut + "/labels.bin") - 4);
  try {
    strategy::MapPreparedDataset(cut);
    ADD_FAILURE() << "a short labels.bin loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("labels.bin"), std::string::npos) << e.what();
  }
  // A LoRA target that names no module.
  models::LoraOptions bad = Lora();
  bad.target_modules = {"q_proj", "qkv_proj"};
  try {
    models::LlamaModule::FromPretrained(Dir("base"), models::GPT2AdamW(kLr), std::nullopt, bad);
    ADD_FAILURE() << "qkv_proj was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("qkv_proj"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
