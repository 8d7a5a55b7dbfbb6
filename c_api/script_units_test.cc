// fsdp2/c_api/script_units_test.cc
//
// Models written in plain PyTorch, scripted and saved by the venv's
// PyTorch 2.11 at test time (tests/script/script_models.py), train through
// the C ABI block by block (fsdp2_model_load_torchscript_with_options) with
// PyTorch's own losses, on N = 1, 2, 3, 4 ranks and with every sharding
// strategy:
//   gpt        one input, cross_entropy, tied head, blocks as units;
//   masked     forward(x, mask): two inputs;
//   self_loss  forward(x, y) returns the loss ("loss": "model");
//   moe        experts (units inside layer units) that get no rows on some
//              ranks, and one expert no rank calls at step 2.
// Each rank takes its rows of PyTorch's global batch. Ranks are processes
// of this binary (tests/harness), meeting through a FileStore; every launch
// has a timeout.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "c_api/fsdp2.h"
#include "c_api/fsdp2_cpp.h"
#include "core/checkpoint/safetensors.h"
#include "tests/harness/multi_process.h"

namespace {

using fsdp2_c::Check;

std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Scripts `name` and trains it with PyTorch, once per test binary.
std::string Make(const std::string& name) {
  const std::string dir = TmpDir() + "/" + name;
  if (access((dir + "/reference.json").c_str(), F_OK) != 0) {
    const std::string cmd =
        std::string(FSDP2_PYTHON) + " tests/script/script_models.py make " + name + " " + dir + " 4";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  return dir;
}

fsdp2_tensor_t View(const at::Tensor& t) {
  fsdp2_tensor_t v{};
  v.data = t.data_ptr();
  v.dtype = t.scalar_type() == at::kLong ? FSDP2_DTYPE_INT64 : FSDP2_DTYPE_FLOAT32;
  v.ndim = static_cast<int32_t>(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) v.shape[d] = t.size(d);
  return v;
}

// One rank: trains DIR/model.pt with STRATEGY_JSON and MODEL_JSON (the
// reference's loss unless it names one) and STEP_JSON ({"accumulate": k,
// "clip": v}); rank 0 writes result.json: {"losses": [...], "grad_norms":
// [...], "peak_unsharded": bytes, "total": bytes}.
FSDP2_SCENARIO(script_rank) {
  const std::string& dir = args.at(0);
  const std::string& strategy_json = args.at(1);
  const std::string& model_json = args.at(2);
  const std::string& step_json = args.at(3);
  const nlohmann::json ref = ReadJson(dir + "/reference.json");
  const nlohmann::json step_options = nlohmann::json::parse(step_json);
  fsdp2_step_options_t so_step;
  fsdp2_step_options_init(&so_step);
  so_step.accumulate_grad_batches = step_options.value("accumulate", 1);
  so_step.gradient_clip_val = step_options.value("clip", 0.0);
  fsdp2_strategy_options_t so;
  fsdp2_strategy_options_init(&so);
  Check(fsdp2_strategy_options_from_json(strategy_json.c_str(), &so));
  fsdp2_strategy_t* raw = nullptr;
  Check(fsdp2_strategy_create(&so, &raw));
  fsdp2_c::StrategyPtr strategy(raw);
  Check(fsdp2_strategy_setup_environment(strategy.get()));
  nlohmann::json model_options = nlohmann::json::parse(model_json);
  if (!model_options.contains("loss")) model_options["loss"] = ref["loss"];
  fsdp2_model_t* model_raw = nullptr;
  Check(fsdp2_model_load_torchscript_with_options((dir + "/model.pt").c_str(),
                                                  model_options.dump().c_str(), &model_raw));
  fsdp2_c::ModelPtr model(model_raw);
  fsdp2_optimizer_options_t oo;
  fsdp2_optimizer_options_init(&oo);
  const auto& adamw = ref["adamw"];
  oo.lr = adamw["lr"].get<double>();
  oo.beta1 = adamw["betas"][0].get<double>();
  oo.beta2 = adamw["betas"][1].get<double>();
  oo.eps = adamw["eps"].get<double>();
  oo.weight_decay = adamw["weight_decay"].get<double>();
  Check(fsdp2_strategy_connect(strategy.get(), model.get(), &oo));
  Check(fsdp2_strategy_parallelize(strategy.get()));
  int32_t dp_rank = 0, dp_size = 1, rank = 0;
  Check(fsdp2_strategy_rank_info(strategy.get(), &rank, nullptr, &dp_rank, &dp_size));
  Check(fsdp2_strategy_reset_peak_memory_stats(strategy.get()));

  fsdp2::checkpoint::SafetensorsFile batches(dir + "/batches.safetensors");
  const int steps = ref["steps"].get<int>(), tensors = ref["tensors"].get<int>();
  nlohmann::json result;
  result["losses"] = nlohmann::json::array();
  result["grad_norms"] = nlohmann::json::array();
  for (int step = 0; step < steps; ++step) {
    std::vector<at::Tensor> mine;
    std::vector<fsdp2_tensor_t> views;
    for (int i = 0; i < tensors; ++i) {
      at::Tensor t = batches.load("s" + std::to_string(step) + "." + std::to_string(i));
      const int64_t rows = t.size(0) / dp_size;
      mine.push_back(t.narrow(0, dp_rank * rows, rows).contiguous());
      views.push_back(View(mine.back()));
    }
    fsdp2_step_result_t r;
    Check(fsdp2_strategy_training_step(strategy.get(), views.data(),
                                       static_cast<int64_t>(views.size()), step, &so_step, &r));
    result["losses"].push_back(r.loss);
    result["grad_norms"].push_back(r.grad_norm);
  }
  fsdp2_memory_stats_t stats;
  fsdp2_memory_stats_init(&stats);
  Check(fsdp2_strategy_memory_stats(strategy.get(), &stats));
  result["peak_unsharded"] = stats.peak_unsharded_param_bytes;
  result["total"] = stats.total_param_bytes;
  if (rank == 0) {
    std::ofstream(fsdp2::testing::WorkerOutDir() + "/result.json") << result.dump();
  }
}

nlohmann::json RunRanks(int world, const std::string& dir, const std::string& strategy_json,
                        const std::string& model_json = "{}",
                        const std::string& step_json = "{}") {
  const auto launch = fsdp2::testing::LaunchScenario(
      "script_rank", world, {dir, strategy_json, model_json, step_json},
      std::chrono::seconds(120));
  EXPECT_TRUE(launch.ok()) << world << " ranks, " << strategy_json << ", " << model_json
                           << ":\n" << launch.Describe();
  const std::string out = fsdp2::testing::ReadFile(launch.out_dir + "/result.json");
  if (!launch.ok() || out.empty()) return nlohmann::json{{"losses", nlohmann::json::array()}};
  return nlohmann::json::parse(out);
}

struct Case {
  int world;
  const char* strategy;
  int shard_group_size;
};

// The sharding strategies and world sizes every model trains with.
const Case kCases[] = {
    {1, "full_shard", 0},    {2, "full_shard", 0},    {3, "full_shard", 0},
    {4, "full_shard", 0},    {2, "shard_grad_op", 0}, {3, "shard_grad_op", 0},
    {2, "no_shard", 0},      {3, "no_shard", 0},      {4, "hybrid_shard", 2},
};

void ExpectPyTorchsLosses(const std::string& model) {
  const std::string dir = Make(model);
  const nlohmann::json ref = ReadJson(dir + "/reference.json");
  const auto want = ref["losses"].get<std::vector<double>>();
  ASSERT_EQ(want.size(), 4u);
  for (const Case& c : kCases) {
    nlohmann::json options = {{"precision", "fp32"}, {"sharding_strategy", c.strategy},
                              {"timeout_ms", 60000}};
    if (c.shard_group_size) options["shard_group_size"] = c.shard_group_size;
    const auto got = RunRanks(c.world, dir, options.dump())["losses"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.size()) << model << " " << options.dump() << " N=" << c.world;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]))
          << model << ", step " << i << ", " << c.strategy << ", N = " << c.world;
    }
  }
}

TEST(ScriptUnits, GPTTrainsWithPyTorchsLosses) { ExpectPyTorchsLosses("gpt"); }
TEST(ScriptUnits, TwoInputsTrainWithPyTorchsLosses) { ExpectPyTorchsLosses("masked"); }
TEST(ScriptUnits, AModelsOwnLossTrainsWithPyTorchsLosses) { ExpectPyTorchsLosses("self_loss"); }
TEST(ScriptUnits, ExpertsThatRunOnOnlySomeRanksTrainWithPyTorchsLosses) {
  ExpectPyTorchsLosses("moe");
}

// Per-block units gather about one block at a time; the whole script as
// one unit (auto_wrap []) gathers everything. Same losses either way, and
// auto_wrap by class name equals the default.
TEST(ScriptUnits, BlocksAreGatheredOneAtATime) {
  const std::string dir = Make("gpt");
  const std::string fsdp = R"({"precision": "fp32", "sharding_strategy": "full_shard"})";
  const auto blocks = RunRanks(2, dir, fsdp);
  const auto whole = RunRanks(2, dir, fsdp, R"({"loss": "cross_entropy", "auto_wrap": []})");
  const auto by_class =
      RunRanks(2, dir, fsdp, R"({"loss": "cross_entropy", "auto_wrap": ["Block"]})");
  ASSERT_EQ(blocks["losses"].size(), 4u);
  EXPECT_EQ(blocks["losses"], by_class["losses"]);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(whole["losses"][i].get<double>(), blocks["losses"][i].get<double>(), 1e-6);
  }
  const int64_t total = blocks["total"].get<int64_t>();
  EXPECT_EQ(whole["peak_unsharded"].get<int64_t>(), total);
  // 3 blocks of ~12.7k parameters and a root of ~2.6k: the root and at
  // most two blocks (one computing, one prefetched) are ever unsharded.
  EXPECT_LT(blocks["peak_unsharded"].get<int64_t>(), total * 3 / 4);
  EXPECT_GT(blocks["peak_unsharded"].get<int64_t>(), 0);
}

// Activation checkpointing of TorchScript units (#14): every block is
// recomputed in backward through the operator, inside its unit's backward
// gather. Losses equal the run without it on 2 ranks, to the last bit, and
// PyTorch's.
TEST(ScriptUnits, CheckpointedBlocksChangeNothing) {
  const std::string dir = Make("gpt");
  const auto want = ReadJson(dir + "/reference.json")["losses"].get<std::vector<double>>();
  for (const char* strategy : {"full_shard", "shard_grad_op"}) {
    nlohmann::json options = {{"precision", "fp32"}, {"sharding_strategy", strategy}};
    const auto plain = RunRanks(2, dir, options.dump())["losses"];
    options["activation_checkpointing"] = "full";
    const auto ac = RunRanks(2, dir, options.dump())["losses"];
    ASSERT_EQ(ac.size(), want.size()) << strategy;
    EXPECT_EQ(ac, plain) << strategy;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(ac[i].get<double>(), want[i], 1e-5 * want[i]) << strategy << " step " << i;
    }
  }
}

// Gradient accumulation (2 micro-batches per rank) and clipping across
// shards, and bf16 mixed precision, work for script units as for C++ ones:
// N ranks equal one process doing the same.
TEST(ScriptUnits, AccumulationClippingAndBf16MatchOneProcess) {
  for (const char* model : {"gpt", "masked"}) {
    const std::string dir = Make(model);
    const std::string step = R"({"accumulate": 2, "clip": 0.5})";
    const std::string fp32 = R"({"precision": "fp32"})";
    const auto one = RunRanks(1, dir, fp32, "{}", step);
    ASSERT_EQ(one["losses"].size(), 4u) << model;
    for (int world : {2, 3}) {
      const auto n = RunRanks(world, dir, fp32, "{}", step);
      ASSERT_EQ(n["losses"].size(), 4u) << model << " N=" << world;
      for (size_t i = 0; i < 4; ++i) {
        const double loss = one["losses"][i].get<double>(), norm = one["grad_norms"][i];
        EXPECT_NEAR(n["losses"][i].get<double>(), loss, 1e-5 * loss) << model << " step " << i;
        EXPECT_NEAR(n["grad_norms"][i].get<double>(), norm, 1e-5 * norm)
            << model << " step " << i << " N=" << world;
      }
    }
    const std::string bf16 = R"({"precision": "bf16"})";
    const auto b1 = RunRanks(1, dir, bf16), b2 = RunRanks(2, dir, bf16);
    const auto want = ReadJson(dir + "/reference.json")["losses"];
    ASSERT_EQ(b2["losses"].size(), 4u) << model;
    for (size_t i = 0; i < 4; ++i) {
      const double loss = b1["losses"][i].get<double>();
      EXPECT_NEAR(b2["losses"][i].get<double>(), loss, 2e-2 * loss) << model << " bf16 " << i;
      EXPECT_NEAR(loss, want[i].get<double>(), 5e-2 * loss) << model << " bf16 vs fp32 " << i;
    }
  }
}

// Bad input is a clear error before any collective, nothing half-applied.
TEST(ScriptUnits, BadPoliciesBatchesAndLossesAreClearErrors) {
  const std::string model = Make("masked") + "/model.pt";
  fsdp2_model_t* m = nullptr;
  EXPECT_EQ(fsdp2_model_load_torchscript_with_options(
                model.c_str(), R"({"auto_wrap": ["Blok"]})", &m),
            FSDP2_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fsdp2_last_error()).find("Residual"), std::string::npos)
      << fsdp2_last_error();
  EXPECT_EQ(m, nullptr);
  EXPECT_EQ(fsdp2_model_load_torchscript_with_options(model.c_str(), R"({"los": "mse"})", &m),
            FSDP2_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fsdp2_model_load_torchscript_with_options(model.c_str(), R"({"loss": "l1"})", &m),
            FSDP2_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fsdp2_model_load_torchscript_with_options(model.c_str(), R"({"auto_wrap": "x"})", &m),
            FSDP2_ERROR_INVALID_ARGUMENT);

  setenv("FSDP2_STORE_PATH", (TmpDir() + "/errors_store").c_str(), 1);
  fsdp2_strategy_options_t so;
  fsdp2_strategy_options_init(&so);
  Check(fsdp2_strategy_options_from_json(R"({"precision": "fp32"})", &so));
  fsdp2_strategy_t* raw = nullptr;
  Check(fsdp2_strategy_create(&so, &raw));
  fsdp2_c::StrategyPtr strategy(raw);
  Check(fsdp2_strategy_setup_environment(strategy.get()));
  Check(fsdp2_model_load_torchscript_with_options(model.c_str(), R"({"loss": "model"})", &m));
  fsdp2_c::ModelPtr owned(m);
  Check(fsdp2_strategy_connect(strategy.get(), m, nullptr));
  Check(fsdp2_strategy_parallelize(strategy.get()));
  const at::Tensor x = at::randn({4, 6}, at::kFloat);
  const at::Tensor mask = at::ones({4}, at::kFloat);
  fsdp2_tensor_t one[1] = {View(x)};
  fsdp2_step_result_t r;
  // forward(x, mask) given only x.
  EXPECT_EQ(fsdp2_strategy_training_step(strategy.get(), one, 1, 0, nullptr, &r),
            FSDP2_ERROR_SHAPE);
  EXPECT_NE(std::string(fsdp2_last_error()).find("forward(x, mask) takes 2"), std::string::npos)
      << fsdp2_last_error();
  // "loss": "model" but the forward returns [B, 3].
  fsdp2_tensor_t two[2] = {View(x), View(mask)};
  EXPECT_EQ(fsdp2_strategy_training_step(strategy.get(), two, 2, 0, nullptr, &r),
            FSDP2_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fsdp2_last_error()).find("must return the loss"), std::string::npos)
      << fsdp2_last_error();
}

}  // namespace

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
