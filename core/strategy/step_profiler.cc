#include "core/strategy/step_profiler.h"

#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdio>
#include <exception>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "core/common/error.h"

namespace fsdp2 {
namespace strategy {
namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// "trace.json" -> "trace.rank3.json"; a name without an extension gets
// ".rank3" appended.
std::string RankFile(const std::string& path, int rank) {
  const std::string::size_type slash = path.find_last_of('/');
  const std::string::size_type dot = path.find_last_of('.');
  const std::string tag = ".rank" + std::to_string(rank);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

}  // namespace

StepProfiler::StepProfiler(int64_t steps, int64_t wait_steps, std::string path)
    : steps_(steps), wait_steps_(wait_steps), path_(std::move(path)) {
  if (steps_ < 0 || wait_steps_ < 0) {
    throw InvalidArgumentError("profile_steps (" + std::to_string(steps_) +
                               ") and profile_wait_steps (" + std::to_string(wait_steps_) +
                               ") must be 0 or more");
  }
  if (steps_ > 0 && path_.empty()) {
    throw InvalidArgumentError("profile_path must name the trace file when profile_steps > 0");
  }
}

StepProfiler::~StepProfiler() {
  try {
    finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp2: the profile trace was not written: %s\n", e.what());
  }
}

void StepProfiler::before_step(int64_t done, int rank, int world_size) {
  if (steps_ == 0) return;
  const int64_t step = done + 1;
  if (open_step_ == step) return;  // another micro-batch of the same step
  if (!active_ && !written_ && step == wait_steps_ + 1) {
    file_ = world_size > 1 ? RankFile(path_, rank) : path_;
    std::set<ActivityType> activities = {ActivityType::CPU};
    if (at::hasCUDA()) activities.insert(ActivityType::CUDA);
    const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
    active_ = true;
  }
  if (!active_) return;
  step_mark_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  const std::string mark = "ProfilerStep#" + std::to_string(step);
  if (step_mark_->isActive()) step_mark_->before(std::string_view(mark));
  open_step_ = step;
}

void StepProfiler::after_step(int64_t done) {
  if (!active_) return;
  if (step_mark_) {
    step_mark_->end();
    step_mark_.reset();
  }
  open_step_ = 0;
  if (done >= wait_steps_ + steps_) stop();
}

void StepProfiler::finish() {
  if (!active_) return;
  if (step_mark_) {
    step_mark_->end();
    step_mark_.reset();
  }
  stop();
}

void StepProfiler::stop() {
  active_ = false;
  written_ = true;
  std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  if (result) result->save(file_);
}

}  // namespace strategy
}  // namespace fsdp2
