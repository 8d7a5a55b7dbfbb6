// Checkpoints of tensor-parallel runs: sharded and full checkpoints saved
// with (dp, tp) = (2, 2) hold every parameter and its AdamW state under the
// original name and full shape, and load on (1, 1), (3, 1), (1, 2), (2, 2)
// and (1, 3); a checkpoint of a run without TP loads into TP layouts. The
// resumed runs give one process's losses (float64, gradient clipping on).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/checkpoint/safetensors.h"
#include "core/strategy/fsdp2_strategy.h"
#include "tests/harness/multi_process.h"
#include "tests/strategy_util.h"

namespace fsdp2 {
namespace testing {
namespace {

constexpr uint64_t kSeed = 11;
constexpr uint64_t kInitSeed = 1234;
constexpr uint64_t kSamplerSeed = 5;
constexpr int64_t kGlobalBatch = 12;
constexpr int64_t kRows = 96;
constexpr double kClip = 0.5;
constexpr int kSavedAt = 2, kEnd = 4;

strategy::Batch Dataset() { return TokenWindows(HeadsGPT().vocab_size, kRows); }

std::vector<std::pair<std::string, at::Tensor>> InitialState() {
  return InitialGPTState(HeadsGPT(), kInitSeed);
}

strategy::DistributedSamplerOptions SamplerOptions() {
  return TestSamplerOptions(kSamplerSeed, kGlobalBatch);
}

// args: dp tp "save"|"save_async" DIR FORMAT | dp tp "load" DIR. Saves
// (in the background) after kSavedAt steps from InitialState(), or loads and
// trains on to kEnd.
FSDP2_SCENARIO(tp_checkpoint) {
  auto o = TestStrategyOptions(kSeed, kSamplerSeed);
  o.data_parallel_size = strategy::ParallelSize::Parse(args.at(0));
  o.tensor_parallel_size = strategy::ParallelSize::Parse(args.at(1));
  const bool save = args.at(2) != "load";
  const std::string dir = args.at(3);
  if (save) o.checkpoint_format = strategy::ParseCheckpointFormat(args.at(4));
  strategy::FSDP2Strategy s(o);
  s.setup_environment();
  s.connect(TestGPTModule(HeadsGPT()));
  s.parallelize();
  int first = 0, end = kSavedAt;
  if (save) {
    s.load_model_state_dict(InitialState());
  } else {
    s.load_checkpoint(dir);
    Check(s.current_epoch_step().step == kSavedAt, "step counter not restored");
    first = kSavedAt;
    end = kEnd;
  }
  auto loader = s.process_dataloader(Dataset(), kGlobalBatch);
  std::ofstream out(WorkerOutDir() + "/losses" + std::to_string(s.world()->rank()) + ".txt");
  out.precision(17);
  for (int i = first; i < end; ++i) {
    at::Tensor loss = s.training_step(loader.batch(i), i);
    s.backward(loss);
    s.optimizer_step(kClip);
    out << s.reduce(loss).item<double>() << "\n";
  }
  if (save) s.save_checkpoint(dir, /*async=*/args.at(2) == "save_async");
  s.teardown();  // waits for a background save
}

struct Layout {
  int dp, tp;
  int world() const { return dp * tp; }
  std::string name() const {
    return "(dp, tp) = (" + std::to_string(dp) + ", " + std::to_string(tp) + ")";
  }
};

LaunchResult RunLayout(const Layout& l, std::vector<std::string> args) {
  args.insert(args.begin(), {std::to_string(l.dp), std::to_string(l.tp)});
  return LaunchScenario("tp_checkpoint", l.world(), args, std::chrono::seconds(240));
}

// Every parameter under its own name and full shape, with its AdamW state.
void ExpectOriginalNamesAndShapes(const std::string& dir, const std::string& format) {
  const auto want = InitialState();
  if (format == "full") {
    checkpoint::SafetensorsFile f(dir + "/checkpoint.safetensors");
    size_t params = 0;
    for (const auto& [name, info] : f.tensors()) params += name.rfind("optim/", 0) != 0;
    EXPECT_EQ(params, want.size());
    for (const auto& [name, value] : want) {
      for (const std::string key : {name, "optim/exp_avg/" + name, "optim/exp_avg_sq/" + name}) {
        ASSERT_TRUE(f.contains(key)) << key;
        EXPECT_EQ(f.info(key).shape, value.sizes().vec()) << key;
      }
    }
    return;
  }
  nlohmann::json m;
  std::ifstream(dir + "/metadata.json") >> m;
  EXPECT_EQ(m["params"].size(), want.size());
  // Rows of each stored tensor over all files: the full first dim, once.
  std::map<std::string, int64_t> rows;
  for (const auto& file : m["files"].items()) {
    checkpoint::SafetensorsFile f(dir + "/" + file.key());
    for (const auto& [name, info] : f.tensors()) rows[name] += info.shape.empty() ? 1 : info.shape[0];
  }
  for (const auto& [name, value] : want) {
    EXPECT_EQ(m["params"][name]["shape"].get<std::vector<int64_t>>(), value.sizes().vec()) << name;
    const int64_t full_rows = value.dim() == 0 ? 1 : value.size(0);
    for (const std::string key : {"model/" + name, "optim/exp_avg/" + name, "optim/exp_avg_sq/" + name}) {
      EXPECT_EQ(rows[key], full_rows) << key;
    }
  }
}

TEST(TensorParallelCheckpoints, LoadOnAnyLayoutWithTheUninterruptedLosses) {
  // One process from InitialState(), clipped like the runs.
  auto ref_module = TestGPTModule(HeadsGPT());
  {
    at::NoGradGuard no_grad;
    auto params = ref_module->module()->named_parameters();
    for (const auto& [name, value] : InitialState()) params[name].copy_(value);
  }
  const strategy::DistributedSampler sampler(kRows, 0, 1, SamplerOptions());
  const auto ref = TrainOneProcess(*ref_module, Dataset(), sampler, kEnd, kClip).losses;
  const std::string tmp = std::getenv("TEST_TMPDIR");
  struct Case {
    Layout saved;
    std::vector<Layout> loaded;
  };
  const std::vector<Case> cases = {
      {{2, 2}, {{1, 1}, {3, 1}, {1, 2}, {2, 2}, {1, 3}}},
      {{2, 1}, {{1, 2}, {1, 3}}},
  };
  for (const std::string format : {"sharded", "full"}) {
    for (const Case& c : cases) {
      const std::string dir = tmp + "/" + format + std::to_string(c.saved.dp) + std::to_string(c.saved.tp);
      auto saved = RunLayout(c.saved, {"save", dir, format});
      ASSERT_TRUE(saved.ok()) << format << " saved on " << c.saved.name() << "\n" << saved.Describe();
      ExpectOriginalNamesAndShapes(dir, format);
      const auto before = ReadNumbers(saved.out_dir + "/losses0.txt");
      ASSERT_EQ(before.size(), static_cast<size_t>(kSavedAt));
      for (const Layout& l : c.loaded) {
        auto loaded = RunLayout(l, {"load", dir});
        const std::string what = format + " saved on " + c.saved.name() + ", loaded on " + l.name();
        ASSERT_TRUE(loaded.ok()) << what << "\n" << loaded.Describe();
        auto losses = before;
        for (double x : ReadNumbers(loaded.out_dir + "/losses0.txt")) losses.push_back(x);
        ASSERT_EQ(losses.size(), ref.size()) << what;
        for (size_t i = 0; i < ref.size(); ++i) {
          EXPECT_NEAR(losses[i], ref[i], 1e-11 * ref[i]) << what << ", step " << i;
        }
      }
      std::printf("%s checkpoint saved on %s resumes with one process's losses on %zu layouts\n",
                  format.c_str(), c.saved.name().c_str(), c.loaded.size());
    }
    // A background save of a tensor-parallel run: the same files.
    const std::string sync_dir = tmp + "/" + format + "22", async_dir = tmp + "/" + format + "22async";
    auto saved = RunLayout({2, 2}, {"save_async", async_dir, format});
    ASSERT_TRUE(saved.ok()) << format << " background save on (2, 2)\n" << saved.Describe();
    for (const auto& e : std::filesystem::directory_iterator(sync_dir)) {
      const std::string name = e.path().filename().string();
      EXPECT_EQ(ReadFile(sync_dir + "/" + name), ReadFile(async_dir + "/" + name))
          << format << ": " << name << " differs between a synchronous and a background save";
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
