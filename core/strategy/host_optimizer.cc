#include "core/strategy/host_optimizer.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <string>
#include <utility>

#include "core/common/error.h"

namespace fsdp2 {
namespace strategy {

HostOptimizer::HostOptimizer(torch::optim::Optimizer& optimizer, LazyZeroGrad& zero_grad)
    : optimizer_(optimizer),
      zero_grad_(zero_grad),
      by_unit_(SteppableByUnit(optimizer)),
      worker_([this] { run(); }) {}

HostOptimizer::~HostOptimizer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

bool HostOptimizer::SteppableByUnit(const torch::optim::Optimizer& optimizer) {
  const torch::optim::Optimizer* o = &optimizer;
  return dynamic_cast<const torch::optim::AdamW*>(o) != nullptr ||
         dynamic_cast<const torch::optim::Adam*>(o) != nullptr ||
         dynamic_cast<const torch::optim::SGD*>(o) != nullptr ||
         dynamic_cast<const torch::optim::RMSprop*>(o) != nullptr ||
         dynamic_cast<const torch::optim::Adagrad*>(o) != nullptr;
}

void HostOptimizer::begin_backward(bool step, bool norm_parts) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stepping_ = step && by_unit_;
    taking_parts_ = !stepping_ && norm_parts;
  }
  post([this] { norm_parts_.clear(); });  // in order with the worker's jobs
}

void HostOptimizer::receive(std::shared_ptr<fsdp::HostGradients> grads) {
  bool step = false, parts = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step = stepping_;
    parts = taking_parts_;
    ++received_;
  }
  post([this, grads = std::move(grads), step, parts] {
    grads->apply();
    if (parts) {
      // The unit's share of the clipping norm, while the device goes on
      // with the backward of the units before it.
      int64_t taken = 0;
      for (const at::Tensor& p : grads->shards()) {
        const at::Tensor& g = p.grad();
        if (!g.defined()) continue;
        norm_parts_.add(g);
        ++taken;
      }
      std::lock_guard<std::mutex> lock(mu_);
      norm_parts_taken_ += taken;
    }
    if (!step) return;
    const std::vector<at::Tensor>& shards = grads->shards();
    for (const at::Tensor& p : shards) {
      if (!stepped_params_.insert(p.unsafeGetTensorImpl()).second) {
        throw InternalError(
            "cpu_offload: a unit's gradients arrived twice in one backward; its "
            "parameters would step twice");
      }
    }
    zero_grad_.materialize(shards);  // zero for those that got none, as in one step
    step_only(shards);
    zero_grad_.zero_grad(shards);  // their host memory is free for the next units
    std::lock_guard<std::mutex> lock(mu_);
    ++stepped_units_;
  });
}

void HostOptimizer::end_backward() {
  bool step = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step = stepping_;
    stepping_ = false;
    taking_parts_ = false;
  }
  if (!step) return;
  stepped_ = true;
  post([this] {
    std::vector<at::Tensor> rest;
    for (const auto& group : optimizer_.param_groups()) {
      for (const at::Tensor& p : group.params()) {
        if (!stepped_params_.count(p.unsafeGetTensorImpl())) rest.push_back(p);
      }
    }
    stepped_params_.clear();
    zero_grad_.materialize(rest);
    step_only(rest);
  });
}

void HostOptimizer::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  if (error_) {
    std::exception_ptr error = std::move(error_);
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void HostOptimizer::drain() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

bool HostOptimizer::take_stepped() {
  const bool stepped = stepped_;
  stepped_ = false;
  return stepped;
}

int64_t HostOptimizer::received() const {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

int64_t HostOptimizer::norm_parts_taken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return norm_parts_taken_;
}

int64_t HostOptimizer::stepped_units() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stepped_units_;
}

void HostOptimizer::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void HostOptimizer::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    job = nullptr;  // what it held goes before the wait ends
    lock.lock();
    if (error && !error_) error_ = error;
    busy_ = false;
    cv_.notify_all();
  }
}

void HostOptimizer::step_only(const std::vector<at::Tensor>& params) {
  std::unordered_set<const c10::TensorImpl*> these;
  for (const at::Tensor& p : params) these.insert(p.unsafeGetTensorImpl());
  // The groups hold only `params` for the step: an optimizer that treats
  // each parameter on its own (SteppableByUnit) then steps them as its step
  // over all of them would, and leaves the others alone.
  auto& groups = optimizer_.param_groups();
  std::vector<std::vector<at::Tensor>> all;
  all.reserve(groups.size());
  for (auto& group : groups) {
    all.push_back(group.params());
    std::vector<at::Tensor> kept;
    for (const at::Tensor& p : all.back()) {
      if (these.count(p.unsafeGetTensorImpl())) kept.push_back(p);
    }
    group.params() = std::move(kept);
  }
  auto restore = [&] {
    for (size_t i = 0; i < groups.size(); ++i) groups[i].params() = std::move(all[i]);
  };
  try {
    optimizer_.step();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

}  // namespace strategy
}  // namespace fsdp2
