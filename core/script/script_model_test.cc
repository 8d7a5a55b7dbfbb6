// fsdp2/core/script/script_model_test.cc
//
// ScriptModel on one rank: the wrapping policy, the names, the rewritten
// call boundaries, and training equal to the plain script's. The models are
// written in PyTorch and scripted by the venv's PyTorch 2.11 at test time
// (tests/script/script_models.py). Multi-rank equivalence with PyTorch is
// //tests:script_units_test.
#include "core/script/script_model.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>

#include "core/checkpoint/safetensors.h"
#include "core/comm/device_mesh.h"
#include "core/comm/world.h"
#include "core/common/error.h"
#include "core/fsdp/fully_shard.h"

namespace fsdp2 {
namespace script {
namespace {

std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// Scripts `name` with PyTorch once per test binary; returns its directory.
std::string Make(const std::string& name) {
  const std::string dir = TmpDir() + "/" + name;
  if (access((dir + "/model.pt").c_str(), F_OK) != 0) {
    const std::string cmd = std::string(FSDP2_PYTHON) + " tests/script/script_models.py make " + name +
                            " " + dir + " 3";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  return dir;
}

fsdp::FSDPOptions SingleRank() {
  static std::shared_ptr<comm::DeviceMesh> mesh = [] {
    comm::RendezvousOptions o;
    o.store_path = TmpDir() + "/script_model_test_store_" + std::to_string(getpid());
    return comm::DeviceMesh::Create(comm::World::Init(o), {1}, {"dp"});
  }();
  fsdp::FSDPOptions options;
  options.mesh = mesh;
  return options;
}

std::set<std::string> Names(torch::nn::Module& m) {
  std::set<std::string> names;
  for (const auto& p : m.named_parameters()) names.insert(p.key());
  return names;
}

int CountCalls(const torch::jit::Module& script, const std::string& kind) {
  int n = 0;
  std::set<const c10::ClassType*> seen;
  for (const auto& m : script.modules()) {
    if (!seen.insert(m.type().get()).second) continue;
    for (auto* fn : m.type()->methods()) {
      auto* g = dynamic_cast<torch::jit::GraphFunction*>(fn);
      if (g == nullptr) continue;
      std::function<void(torch::jit::Block*)> walk = [&](torch::jit::Block* b) {
        for (torch::jit::Node* node : b->nodes()) {
          if (node->kind().toQualString() == kind) ++n;
          for (torch::jit::Block* inner : node->blocks()) walk(inner);
        }
      };
      walk(g->graph()->block());
    }
  }
  return n;
}

TEST(ScriptModel, DefaultPolicyWrapsEveryModuleListChildAndKeepsTheScriptsNames) {
  ScriptModel model = LoadScriptModel(Make("gpt") + "/model.pt", {});
  EXPECT_EQ(model->unit_paths(), (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2"}));
  std::set<std::string> script_names;
  for (const auto& p : model->script().named_parameters()) script_names.insert(p.name);
  EXPECT_EQ(Names(*model), script_names);
  EXPECT_TRUE(Names(*model).count("blocks.1.attn.qkv.weight"));
  // The loop over the ModuleList is unrolled: one call site per block.
  EXPECT_EQ(CountCalls(model->script(), "fsdp2::unit_forward"), 3);
  EXPECT_EQ(model->num_inputs(), 1u);
  EXPECT_EQ(model->input_names(), std::vector<std::string>{"tokens"});

  // Experts in a ModuleList inside each layer of a ModuleList: the experts
  // first (bottom-up), then the layers.
  ScriptModel moe = LoadScriptModel(Make("moe") + "/model.pt", {});
  const auto& paths = moe->unit_paths();
  ASSERT_EQ(paths.size(), 10u);
  EXPECT_EQ(paths.front(), "layers.0.experts.0");
  EXPECT_EQ(paths[7], "layers.1.experts.3");
  EXPECT_EQ(paths[8], "layers.0");
  EXPECT_EQ(paths[9], "layers.1");
  EXPECT_EQ(moe->num_inputs(), 2u);
}

TEST(ScriptModel, PoliciesNameClassesOrPaths) {
  const std::string path = Make("moe") + "/model.pt";
  ScriptWrapPolicy by_class;
  by_class.auto_wrap = std::vector<std::string>{"MoELayer"};
  EXPECT_EQ(LoadScriptModel(path, by_class)->unit_paths(),
            (std::vector<std::string>{"layers.0", "layers.1"}));
  ScriptWrapPolicy qualified;
  qualified.auto_wrap = std::vector<std::string>{"linear.Linear"};  // torch.nn's
  EXPECT_EQ(LoadScriptModel(path, qualified)->unit_paths().size(), 2u + 2u + 16u);
  ScriptWrapPolicy by_path;
  by_path.auto_wrap = std::vector<std::string>{"layers.1.experts.2", "inp"};
  EXPECT_EQ(LoadScriptModel(path, by_path)->unit_paths(),
            (std::vector<std::string>{"layers.1.experts.2", "inp"}));
  ScriptWrapPolicy none;
  none.auto_wrap = std::vector<std::string>{};
  EXPECT_TRUE(LoadScriptModel(path, none)->unit_paths().empty());

  ScriptWrapPolicy bad;
  bad.auto_wrap = std::vector<std::string>{"Blok"};
  try {
    LoadScriptModel(path, bad);
    ADD_FAILURE() << "no error for a class the script does not have";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("\"Blok\" is neither"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MoELayer"), std::string::npos) << e.what();
  }
  bad.auto_wrap = std::vector<std::string>{"MoE"};  // the root's class
  EXPECT_THROW(LoadScriptModel(path, bad), InvalidArgumentError);
  EXPECT_THROW(LoadScriptModel(TmpDir() + "/missing.pt", {}), IoError);
}

at::Tensor Loss(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

// FULL_SHARD per block on one rank trains exactly as the plain script, with
// and without the blocks checkpointed (recomputed through the operator).
class ShardedScript : public ::testing::TestWithParam<bool> {};

TEST_P(ShardedScript, TrainsAsThePlainScript) {
  const std::string dir = Make("gpt");
  checkpoint::SafetensorsFile batches(dir + "/batches.safetensors");
  torch::jit::Module plain = torch::jit::load(dir + "/model.pt");
  plain.train();
  std::vector<at::Tensor> plain_params;
  for (const auto& p : plain.parameters()) plain_params.push_back(p);
  torch::optim::AdamW plain_opt(plain_params, torch::optim::AdamWOptions(1e-2));

  ScriptModel model = LoadScriptModel(dir + "/model.pt", {});
  const fsdp::FSDPOptions options = SingleRank();
  for (const auto& unit : model->fsdp_unit_plan()) fsdp::fully_shard(unit, options);
  fsdp::fully_shard(model.ptr(), options);
  if (GetParam()) {
    EXPECT_EQ(fsdp::apply_activation_checkpointing(*model, fsdp::ActivationCheckpointing::Full()),
              (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2"}));
  }
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));

  for (int step = 0; step < 3; ++step) {
    const at::Tensor tokens = batches.load("s" + std::to_string(step) + ".0");
    const at::Tensor targets = batches.load("s" + std::to_string(step) + ".1");
    at::Tensor want = Loss(plain.forward({tokens}).toTensor(), targets);
    plain_opt.zero_grad(/*set_to_none=*/false);
    want.backward();
    plain_opt.step();
    at::Tensor got = Loss(model->forward({tokens}).toTensor(), targets);
    opt.zero_grad(/*set_to_none=*/false);
    got.backward();
    opt.step();
    EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-6 * want.item<double>())
        << "step " << step;
  }
  for (const auto& unit : model->fsdp_unit_plan()) {
    EXPECT_NE(fsdp::unit_of(*unit), nullptr);
    EXPECT_EQ(fsdp::is_checkpointed(*unit), GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpointed, ShardedScript, ::testing::Bool());

}  // namespace
}  // namespace script
}  // namespace fsdp2
