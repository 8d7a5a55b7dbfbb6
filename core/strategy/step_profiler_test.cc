// StepProfiler on the CPU: the trace file is written, holds the ops of the
// traced steps (and their "ProfilerStep#N" marks) and none of the steps
// around them; a run that stops early still gets its trace; each rank of
// several writes its own file. And through FSDP2Strategy: profile_steps
// traces forward, backward and the optimizer of training steps.
#include "core/strategy/step_profiler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "core/common/error.h"
#include "core/models/mlp_module.h"
#include "core/strategy/fsdp2_strategy.h"

namespace fsdp2 {
namespace strategy {
namespace {

// The names of the trace's events; fails the test if it is not JSON with
// traceEvents.
std::set<std::string> EventNames(const std::string& file) {
  std::ifstream in(file);
  EXPECT_TRUE(in.good()) << file << " was not written";
  std::set<std::string> names;
  if (!in.good()) return names;
  const nlohmann::json trace = nlohmann::json::parse(in);
  EXPECT_TRUE(trace.contains("traceEvents")) << file;
  for (const auto& event : trace.value("traceEvents", nlohmann::json::array())) {
    if (event.contains("name") && event["name"].is_string()) names.insert(event["name"]);
  }
  return names;
}

bool HasNameContaining(const std::set<std::string>& names, const std::string& part) {
  for (const std::string& n : names) {
    if (n.find(part) != std::string::npos) return true;
  }
  return false;
}

const at::Tensor kA = at::ones({8, 8});

TEST(StepProfilerTest, TracesTheStepsAfterTheWaitAndNothingElse) {
  const std::string path = ::testing::TempDir() + "/steps.json";
  StepProfiler profiler(/*steps=*/2, /*wait_steps=*/1, path);
  profiler.before_step(0, 0, 1);  // step 1: waiting
  EXPECT_FALSE(profiler.active());
  at::cumsum(kA, 0);
  profiler.after_step(1);
  profiler.before_step(1, 0, 1);  // step 2: traced
  EXPECT_TRUE(profiler.active());
  at::mm(kA, kA);
  profiler.after_step(2);
  profiler.before_step(2, 0, 1);  // step 3: traced, two micro-batches
  at::mm(kA, kA);
  profiler.before_step(2, 0, 1);
  at::tanh(kA);
  profiler.after_step(3);
  EXPECT_FALSE(profiler.active());
  profiler.before_step(3, 0, 1);  // step 4: after the trace
  EXPECT_FALSE(profiler.active());
  at::cumprod(kA, 0);
  profiler.after_step(4);

  EXPECT_EQ(profiler.file(), path);
  const std::set<std::string> names = EventNames(path);
  EXPECT_TRUE(names.count("aten::mm")) << "the traced steps' ops";
  EXPECT_TRUE(names.count("aten::tanh")) << "the second micro-batch of step 3";
  EXPECT_TRUE(names.count("ProfilerStep#2"));
  EXPECT_TRUE(names.count("ProfilerStep#3"));
  EXPECT_FALSE(names.count("aten::cumsum")) << "step 1 ran before the trace";
  EXPECT_FALSE(names.count("aten::cumprod")) << "step 4 ran after it";
  EXPECT_FALSE(names.count("ProfilerStep#1"));
  EXPECT_FALSE(names.count("ProfilerStep#4"));
}

TEST(StepProfilerTest, AnEarlyEndStillWritesEachRanksFile) {
  const std::string path = ::testing::TempDir() + "/early.json";
  {
    StepProfiler profiler(/*steps=*/5, /*wait_steps=*/0, path);
    profiler.before_step(0, /*rank=*/3, /*world_size=*/4);
    EXPECT_EQ(profiler.file(), ::testing::TempDir() + "/early.rank3.json");
    at::mm(kA, kA);
    profiler.after_step(1);
    EXPECT_TRUE(profiler.active());
  }  // destroyed after one of its five steps
  const std::set<std::string> names = EventNames(::testing::TempDir() + "/early.rank3.json");
  EXPECT_TRUE(names.count("aten::mm"));
  EXPECT_TRUE(names.count("ProfilerStep#1"));
}

TEST(StepProfilerTest, NothingToTraceWritesNothingAndBadCountsThrow) {
  const std::string path = ::testing::TempDir() + "/none.json";
  StepProfiler profiler(0, 1, path);
  profiler.before_step(1, 0, 1);
  EXPECT_FALSE(profiler.active());
  profiler.after_step(2);
  profiler.finish();
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_THROW(StepProfiler(-1, 1, path), InvalidArgumentError);
  EXPECT_THROW(StepProfiler(1, -1, path), InvalidArgumentError);
  EXPECT_THROW(StepProfiler(1, 0, ""), InvalidArgumentError);
}

// Trains an MLP through FSDP2Strategy for 3 steps, tracing steps 2 and 3
// into `path` (with `cpu_offload`, the steps taken during backward: told
// no clipping); the trace must appear after step 3 and not before. Returns
// its event names.
std::set<std::string> TraceThreeSteps(const std::string& path, bool cpu_offload) {
  FSDP2StrategyOptions options;
  options.mp_policy = fsdp::MixedPrecisionPolicy{};
  options.cpu_offload = cpu_offload;
  options.profile_steps = 2;
  options.profile_wait_steps = 1;
  options.profile_path = path;
  FSDP2Strategy strategy(options);
  strategy.setup_environment();
  models::MLPConfig config;
  strategy.connect(std::make_shared<models::MLPModule>(config));
  strategy.parallelize();
  const Batch batch = {at::randn({6, config.in_features}), at::randn({6, config.out_features})};
  for (int step = 0; step < 3; ++step) {
    strategy.backward(strategy.training_step(batch, step), /*sync_gradients=*/true,
                      /*max_grad_norm=*/0.0);
    strategy.optimizer_step(/*max_grad_norm=*/0.0);
    EXPECT_EQ(std::ifstream(path).good(), step == 2) << "written after step 3, step " << step + 1;
  }
  const std::set<std::string> names = EventNames(path);
  EXPECT_TRUE(names.count("ProfilerStep#2"));
  EXPECT_TRUE(names.count("ProfilerStep#3"));
  EXPECT_FALSE(names.count("ProfilerStep#1"));
  return names;
}

TEST(StepProfilerTest, TheStrategyTracesForwardBackwardAndTheOptimizer) {
  const std::set<std::string> names =
      TraceThreeSteps(::testing::TempDir() + "/strategy.json", /*cpu_offload=*/false);
  EXPECT_TRUE(names.count("aten::addmm") || names.count("aten::linear")) << "forward";
  EXPECT_TRUE(HasNameContaining(names, "Backward")) << "backward";
  // AdamW's denominator; nothing else in this model takes a square root.
  EXPECT_TRUE(names.count("aten::sqrt")) << "the optimizer";
}

// With CPU offload and no clipping the optimizer steps during backward()
// (on the host optimizer's thread) and optimizer_step() only counts the
// step: the trace still starts and ends with the steps.
TEST(StepProfilerTest, StepsTakenDuringBackwardWithCpuOffloadCount) {
  TraceThreeSteps(::testing::TempDir() + "/offload.json", /*cpu_offload=*/true);
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
