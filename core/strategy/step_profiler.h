// fsdp2/core/strategy/step_profiler.h
//
// StepProfiler: traces a few training steps with LibTorch's own profiler
// (Kineto) and writes them as a Chrome / Perfetto trace (open it at
// ui.perfetto.dev or chrome://tracing): the CPU ops of forward, backward
// and the optimizer, each step marked "ProfilerStep#N", and, where CUDA is
// present, the CUDA kernels and memory copies of every stream. It is how
// FSDP2Strategy honours FSDP2StrategyOptions::profile_steps.
//
// The strategy calls before_step() at the start of each training step and
// after_step() once the optimizer has stepped, on the thread that trains
// (the profiler is that thread's; autograd's own threads follow it).
#ifndef FSDP2_CORE_STRATEGY_STEP_PROFILER_H_
#define FSDP2_CORE_STRATEGY_STEP_PROFILER_H_

#include <cstdint>
#include <memory>
#include <string>

namespace at {
struct RecordFunction;
}

namespace fsdp2 {
namespace strategy {

// Traces a few training steps with LibTorch's profiler and writes a
// Chrome/Perfetto trace (see the file comment).
class StepProfiler {
 public:
  // Traces optimizer steps wait_steps + 1 ... wait_steps + steps (1-based)
  // into `path`; steps 0 traces nothing. With more than one rank, rank r
  // writes `path` with ".rank<r>" before its extension. Throws
  // InvalidArgumentError for negative counts or, when tracing, an empty
  // path.
  StepProfiler(int64_t steps, int64_t wait_steps, std::string path);
  ~StepProfiler();  // finish()es, reporting an error on stderr
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // `done`: optimizer steps taken so far. Starts the trace when step
  // done + 1 is the first to trace, and marks the step.
  void before_step(int64_t done, int rank, int world_size);
  // `done`: optimizer steps taken now. Closes the step's mark; writes the
  // trace after the last step to trace.
  void after_step(int64_t done);
  // Writes what a trace still running has recorded (a run that ended
  // before its last traced step); nothing otherwise.
  void finish();

  // Whether a trace is being recorded.
  bool active() const { return active_; }
  // The file this rank writes (set by the first before_step()).
  const std::string& file() const { return file_; }

 private:
  void stop();

  int64_t steps_;
  int64_t wait_steps_;
  std::string path_;
  std::string file_;
  bool active_ = false;
  bool written_ = false;  // the trace is written: never again
  int64_t open_step_ = 0;  // the step whose mark is open; 0: none
  std::unique_ptr<at::RecordFunction> step_mark_;
};

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_STEP_PROFILER_H_
