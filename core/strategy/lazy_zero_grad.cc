#include "core/strategy/lazy_zero_grad.h"

#include <ATen/ATen.h>

#include <unordered_set>

namespace fsdp2 {
namespace strategy {

void LazyZeroGrad::zero_grad(torch::optim::Optimizer& optimizer) {
  // Those freed before and given a gradient since are freed again below.
  std::vector<at::Tensor> still_freed;
  for (at::Tensor& p : freed_) {
    if (!p.grad().defined()) still_freed.push_back(std::move(p));
  }
  freed_ = std::move(still_freed);
  for (auto& group : optimizer.param_groups()) {
    for (at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      p.mutable_grad() = at::Tensor();
      freed_.push_back(p);
    }
  }
}

void LazyZeroGrad::materialize() {
  for (at::Tensor& p : freed_) {
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p, at::MemoryFormat::Contiguous);
  }
  freed_.clear();
}

void LazyZeroGrad::materialize(const std::vector<at::Tensor>& params) {
  std::unordered_set<const c10::TensorImpl*> these;
  for (const at::Tensor& p : params) these.insert(p.unsafeGetTensorImpl());
  std::vector<at::Tensor> others;
  for (at::Tensor& p : freed_) {
    if (!these.count(p.unsafeGetTensorImpl())) {
      others.push_back(std::move(p));
    } else if (!p.grad().defined()) {
      p.mutable_grad() = at::zeros_like(p, at::MemoryFormat::Contiguous);
    }
  }
  freed_ = std::move(others);
}

void LazyZeroGrad::zero_grad(const std::vector<at::Tensor>& params) {
  for (const at::Tensor& p : params) {
    if (!p.grad().defined()) continue;
    p.mutable_grad() = at::Tensor();
    freed_.push_back(p);
  }
}

size_t LazyZeroGrad::pending() const {
  size_t n = 0;
  for (const at::Tensor& p : freed_) n += p.grad().defined() ? 0 : 1;
  return n;
}

}  // namespace strategy
}  // namespace fsdp2
