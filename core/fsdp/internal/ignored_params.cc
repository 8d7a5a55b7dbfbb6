#include "core/fsdp/internal/ignored_params.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <utility>

namespace fsdp2 {
namespace fsdp {

IgnoredParams::IgnoredParams(std::vector<at::Tensor> params,
                             c10::optional<at::ScalarType> param_dtype)
    : params_(std::move(params)), dtype_(param_dtype) {
  if (!dtype_) return;
  for (const at::Tensor& p : params_) {
    if (p.is_floating_point() && p.scalar_type() != *dtype_) cast_.push_back(p);
  }
}

void IgnoredParams::cast() {
  if (is_cast_ || cast_.empty()) return;
  at::NoGradGuard no_grad;
  own_.clear();
  for (at::Tensor& p : cast_) {
    at::Tensor own = p.detach();
    // set_data keeps the tensor (and its requires_grad); autograd records
    // the copy's dtype for the gradient it produces.
    p.set_data(own.to(*dtype_));
    own_.push_back(std::move(own));
  }
  is_cast_ = true;
}

void IgnoredParams::restore() {
  if (!is_cast_) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < cast_.size(); ++i) {
    at::Tensor& p = cast_[i];
    p.set_data(own_[i]);
    at::Tensor& grad = p.mutable_grad();
    if (grad.defined() && grad.scalar_type() != p.scalar_type()) grad = grad.to(p.scalar_type());
  }
  own_.clear();
  is_cast_ = false;
}

}  // namespace fsdp
}  // namespace fsdp2
