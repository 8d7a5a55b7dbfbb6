// fsdp2/core/strategy/host_optimizer.h
//
// HostOptimizer: the optimizer's steps with CPU offload, on a thread of
// their own, one unit at a time, while backward goes on.
//
// With FSDP2StrategyOptions::cpu_offload the engine hands each unit's
// reduced gradients over in host memory (fsdp::HostGradients, core/fsdp/
// offload.h) as soon as they are copied off the device. HostOptimizer
// queues them for its worker thread, which adds them to the shards' .grad
// and, in a backward told that the optimizer may step at once (no
// clipping), steps that unit's parameters right away: the host's cores run
// the optimizer (FusedAdamW: over all of them) while the device computes
// the gradients of the units before it. After the backward, it steps what
// no unit stepped (parameters outside the units, such as ignored ones, and
// units that got no gradients here). With clipping, the norm needs every
// gradient: the worker lands them and takes each one's share of the norm
// as it lands (fsdp::GradNormParts), and FSDP2Strategy::optimizer_step
// adds the shares up, clips and steps after the backward.
//
// The arithmetic is the optimizer's own, parameter by parameter, and
// LazyZeroGrad's zero gradients are given per unit as they would be for the
// whole model, so the results equal stepping after the backward bit for
// bit. Stepping part of the parameters needs an optimizer whose step treats
// each parameter on its own: torch::optim's Adam, AdamW (and FusedAdamW),
// SGD, RMSprop and Adagrad; with any other, every step waits for the end of
// backward (SteppableByUnit).
//
// Thread-safety: receive() may be called from any thread (the autograd
// engine's); the rest from the training thread. Between begin_backward()
// and wait() the worker owns the optimizer, the shards' .grad and the
// LazyZeroGrad: the training thread must not touch them.
#ifndef FSDP2_CORE_STRATEGY_HOST_OPTIMIZER_H_
#define FSDP2_CORE_STRATEGY_HOST_OPTIMIZER_H_

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/fsdp/clip_grad.h"
#include "core/fsdp/offload.h"
#include "core/strategy/lazy_zero_grad.h"

namespace fsdp2 {
namespace strategy {

// What CPU offload's host optimizer did since parallelize()
// (FSDP2Strategy::offload_stats(); all zero without cpu_offload).
struct OffloadStats {
  int64_t units_received = 0;  // units' gradients handed over in host memory
  int64_t units_stepped_in_backward = 0;  // units stepped while backward went on
  // Gradients whose share of the clipping norm was taken as they landed
  // during a backward.
  int64_t norm_parts_taken = 0;
  // Shares taken that the clipping then used (not taken again).
  int64_t norm_parts_used = 0;
};

// The optimizer's steps with CPU offload, on a worker thread, unit by unit
// (see the file comment).
class HostOptimizer {
 public:
  // Steps `optimizer`, zeroing through `zero_grad`; both must outlive it.
  // Starts the worker thread.
  HostOptimizer(torch::optim::Optimizer& optimizer, LazyZeroGrad& zero_grad);
  // Waits for the work queued (dropping its error) and stops the worker.
  ~HostOptimizer();
  HostOptimizer(const HostOptimizer&) = delete;
  HostOptimizer& operator=(const HostOptimizer&) = delete;

  // Whether `optimizer` steps each parameter on its own (see the file
  // comment), so that a unit's parameters can step apart.
  static bool SteppableByUnit(const torch::optim::Optimizer& optimizer);

  // A backward begins. `step`: each unit steps as its gradients arrive
  // (ignored unless SteppableByUnit); else they only land on .grad, and
  // with `norm_parts` (a backward whose step clips) the worker takes each
  // landed gradient's share of the clipping norm (norm_parts()) while the
  // backward goes on. Forgets the parts taken before.
  void begin_backward(bool step, bool norm_parts = false);
  // The engine's sink (fsdp::set_host_gradient_sink): queues `grads`.
  void receive(std::shared_ptr<fsdp::HostGradients> grads);
  // The backward has returned: when it steps, queues the step of every
  // parameter of the optimizer that no unit stepped.
  void end_backward();
  // Waits until everything queued is done; rethrows the first error of
  // the work since the last wait().
  void wait();
  // Waits until everything queued is done, leaving an error for wait().
  void drain() const;
  // The gradients' shares of the 2-norm taken in the last backward told
  // norm_parts, for clip_grad_norm_; read after wait(), and clear() it once
  // clipped (its parts hold the gradients).
  fsdp::GradNormParts& norm_parts() { return norm_parts_; }
  // Gradients whose norm part the worker took during a backward, since
  // construction.
  int64_t norm_parts_taken() const;
  // Whether the backward since the last take_stepped() stepped the
  // optimizer (then optimizer_step() must not); reading clears it.
  bool take_stepped();
  // Units whose gradients were received since construction (for tests:
  // how many hand-overs there were).
  int64_t received() const;
  // Units stepped by the worker during a backward, since construction.
  int64_t stepped_units() const;

 private:
  void post(std::function<void()> job);
  void run();
  // Steps the optimizer over `params` alone (the others stay as they are).
  void step_only(const std::vector<at::Tensor>& params);

  torch::optim::Optimizer& optimizer_;
  LazyZeroGrad& zero_grad_;
  const bool by_unit_;
  bool stepping_ = false;  // this backward steps per unit (training thread)
  bool taking_parts_ = false;  // this backward takes norm parts (training thread)
  fsdp::GradNormParts norm_parts_;  // the worker's during a backward
  bool stepped_ = false;   // the last backward stepped
  // The worker's: parameters stepped in this backward.
  std::unordered_set<const c10::TensorImpl*> stepped_params_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  int64_t received_ = 0;
  int64_t stepped_units_ = 0;
  int64_t norm_parts_taken_ = 0;
  std::thread worker_;  // last: started once the rest is set up
};

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_HOST_OPTIMIZER_H_
