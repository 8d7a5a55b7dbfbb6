// fsdp2/c_api/torchscript_test.cc
//
// A TorchScript file trains through the C ABI (fsdp2_model_load_torchscript)
// exactly as LibTorch trains the same script module by hand, on 1 rank and
// on 2 ranks (the whole module is one FSDP unit, sharded at rest). The
// script is written here with torch::jit::Module::define and save, as
// Python's torch.jit.save would.
//
// Ranks are processes of this binary (tests/harness), meeting through a
// FileStore; each launch has a timeout, and a failing rank's log is in the
// test failure.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "c_api/fsdp2.h"
#include "c_api/fsdp2_cpp.h"
#include "tests/harness/multi_process.h"

namespace {

using fsdp2_c::Check;

constexpr int kRows = 8, kIn = 5, kOut = 3, kSteps = 4;
constexpr double kLr = 0.05;

std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// A two-layer script module with parameters "w1", "b1", "w2"; with
// `dropout`, dropout on the hidden layer in training.
std::string WriteScript(bool dropout = false) {
  torch::manual_seed(3);
  torch::jit::Module m("Net");
  // Trainable parameters, as a Python nn.Module's (requires_grad is saved).
  m.register_parameter("w1", (at::randn({7, kIn}) * 0.3).set_requires_grad(true), false);
  m.register_parameter("b1", at::zeros({7}).set_requires_grad(true), false);
  m.register_parameter("w2", (at::randn({kOut, 7}) * 0.3).set_requires_grad(true), false);
  // As a Python module's: dropout follows it.
  if (dropout) m.register_attribute("training", c10::BoolType::get(), true);
  m.define(dropout ? R"(
def forward(self, x):
    h = torch.tanh(torch.matmul(x, self.w1.t()) + self.b1)
    h = torch.dropout(h, 0.3, self.training)
    return torch.matmul(h, self.w2.t())
)" : R"(
def forward(self, x):
    h = torch.tanh(torch.matmul(x, self.w1.t()) + self.b1)
    return torch.matmul(h, self.w2.t())
)");
  const std::string path = TmpDir() + (dropout ? "/net_dropout.pt" : "/net.pt");
  m.save(path);
  return path;
}

at::Tensor Inputs(int step) {
  return at::sin(at::arange(kRows * kIn, at::kFloat).view({kRows, kIn}) * (0.3 + 0.1 * step));
}
at::Tensor Targets(int step) {
  return at::cos(at::arange(kRows * kOut, at::kFloat).view({kRows, kOut}) * (0.2 + 0.05 * step));
}

// The reference: LibTorch training the script module directly.
std::vector<double> ReferenceLosses(const std::string& path) {
  torch::jit::Module m = torch::jit::load(path);
  std::vector<at::Tensor> params;
  for (const auto& p : m.parameters()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(kLr).weight_decay(0.0));
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor out = m.forward({Inputs(step)}).toTensor();
    at::Tensor loss = torch::nn::functional::mse_loss(out, Targets(step));
    opt.zero_grad(/*set_to_none=*/false);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

fsdp2_tensor_t View(const at::Tensor& t) {
  fsdp2_tensor_t v{};
  v.data = t.data_ptr();
  v.dtype = FSDP2_DTYPE_FLOAT32;
  v.ndim = static_cast<int32_t>(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) v.shape[d] = t.size(d);
  return v;
}

// One rank. args: the script, the strategy options (JSON). Trains through
// the C ABI and writes its losses to losses.txt (rank 0).
FSDP2_SCENARIO(ts_rank) {
  fsdp2_strategy_options_t so;
  fsdp2_strategy_options_init(&so);
  Check(fsdp2_strategy_options_from_json(args.at(1).c_str(), &so));
  fsdp2_strategy_t* raw = nullptr;
  Check(fsdp2_strategy_create(&so, &raw));
  fsdp2_c::StrategyPtr strategy(raw);
  Check(fsdp2_strategy_setup_environment(strategy.get()));
  fsdp2_model_t* model_raw = nullptr;
  Check(fsdp2_model_load_torchscript(args.at(0).c_str(), "mse", &model_raw));
  fsdp2_c::ModelPtr model(model_raw);
  fsdp2_optimizer_options_t oo;
  fsdp2_optimizer_options_init(&oo);
  oo.lr = kLr;
  oo.weight_decay = 0.0;
  Check(fsdp2_strategy_connect(strategy.get(), model.get(), &oo));
  Check(fsdp2_strategy_parallelize(strategy.get()));
  int32_t dp_rank = 0, dp_size = 1, rank = 0;
  Check(fsdp2_strategy_rank_info(strategy.get(), &rank, nullptr, &dp_rank, &dp_size));
  std::ofstream out;
  out.precision(17);
  if (rank == 0) out.open(fsdp2::testing::WorkerOutDir() + "/losses.txt");
  const int rows = kRows / dp_size;
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor x = Inputs(step).narrow(0, dp_rank * rows, rows).contiguous();
    at::Tensor y = Targets(step).narrow(0, dp_rank * rows, rows).contiguous();
    fsdp2_tensor_t batch[2] = {View(x), View(y)};
    fsdp2_step_result_t result;
    Check(fsdp2_strategy_training_step(strategy.get(), batch, 2, step, nullptr, &result));
    if (rank == 0) out << result.loss << "\n";
  }
}

std::vector<double> RunRanks(int world, const std::string& script,
                             const std::string& json = R"({"precision": "fp32"})") {
  const auto launch =
      fsdp2::testing::LaunchScenario("ts_rank", world, {script, json}, std::chrono::seconds(120));
  EXPECT_TRUE(launch.ok()) << world << " ranks, " << json << ":\n" << launch.Describe();
  return fsdp2::testing::ReadNumbers(launch.out_dir + "/losses.txt");
}

TEST(TorchScriptTest, TrainsLikeLibTorchOnOneAndTwoRanks) {
  const std::string script = WriteScript();
  const std::vector<double> reference = ReferenceLosses(script);
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(reference.back(), reference.front()) << "the reference did not learn";
  for (int world : {1, 2}) {
    const std::vector<double> losses = RunRanks(world, script);
    ASSERT_EQ(losses.size(), reference.size()) << world << " ranks";
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], reference[i], 1e-5 * std::abs(reference[i]))
          << "step " << i << " on " << world << " ranks";
    }
  }
}

// Activation checkpointing of a TorchScript model: the model is one FSDP
// unit, so the whole script is recomputed in backward (its dropout masks
// replayed). Losses equal the run without it, to the last bit.
TEST(TorchScriptTest, ActivationCheckpointingChangesNothing) {
  const std::string script = WriteScript(/*dropout=*/true);
  for (int world : {1, 2}) {
    const auto plain = RunRanks(world, script, R"({"precision": "fp32", "seed": 3})");
    const auto ac = RunRanks(
        world, script,
        R"({"precision": "fp32", "seed": 3, "activation_checkpointing": "full"})");
    ASSERT_EQ(plain.size(), static_cast<size_t>(kSteps)) << world << " ranks";
    EXPECT_EQ(ac, plain) << world << " ranks";
    EXPECT_LT(plain.back(), plain.front()) << "did not learn";
  }
  // Dropout is on: another seed draws other masks.
  EXPECT_NE(RunRanks(1, script, R"({"precision": "fp32", "seed": 4})"),
            RunRanks(1, script, R"({"precision": "fp32", "seed": 3})"));
}

TEST(TorchScriptTest, BadFilesAndLossesAreErrors) {
  fsdp2_model_t* model = nullptr;
  const std::string junk = TmpDir() + "/junk.pt";
  std::ofstream(junk) << "not a zip archive";
  EXPECT_EQ(fsdp2_model_load_torchscript(junk.c_str(), "mse", &model), FSDP2_ERROR_IO);
  EXPECT_NE(std::string(fsdp2_last_error()).find("cannot load TorchScript file"), std::string::npos)
      << fsdp2_last_error();
  EXPECT_EQ(model, nullptr);
  EXPECT_EQ(fsdp2_model_load_torchscript(WriteScript().c_str(), "l1", &model),
            FSDP2_ERROR_INVALID_ARGUMENT);
}

}  // namespace

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
