#include "core/kernels/rms_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <utility>

#include "core/kernels/dispatch.h"
#ifdef FSDP2_KERNELS_CUDA
#include "core/kernels/internal/cuda_launch.h"
#endif

namespace fsdp2 {
namespace kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool UsesKernel(const at::Tensor& x, const at::Tensor& weight) {
  return RunsCudaKernel(x) && x.dim() >= 1 && x.numel() > 0 &&
         weight.scalar_type() == x.scalar_type() && weight.device() == x.device();
}

at::ScalarType ComputeType(const at::Tensor& x) {
  return at::promote_types(x.scalar_type(), at::kFloat);
}

// Forward: {y, rstd}, with h = x (+ residual) written to `h`.
std::pair<at::Tensor, at::Tensor> Forward(const at::Tensor& x, const at::Tensor& residual,
                                          const at::Tensor& weight, double eps, at::Tensor& h) {
#ifdef FSDP2_KERNELS_CUDA
  if (UsesKernel(x, weight)) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous();
    const at::Tensor rc = residual.defined() ? residual.contiguous() : at::Tensor();
    const at::Tensor w = weight.to(at::kFloat).contiguous();
    const int64_t cols = x.size(-1), rows = xc.numel() / cols;
    h = residual.defined() ? at::empty(x.sizes(), xc.options()) : xc;
    at::Tensor y = at::empty(x.sizes(), xc.options());
    at::Tensor rstd = at::empty({rows}, xc.options().dtype(at::kFloat));
    FSDP2_KERNEL_CHECK(cuda::RmsNormForward(
        internal::ElementTypeOf(xc), xc.data_ptr(), rc.defined() ? rc.data_ptr() : nullptr,
        w.data_ptr<float>(), rows, cols, static_cast<float>(eps),
        residual.defined() ? h.data_ptr() : nullptr, y.data_ptr(), rstd.data_ptr<float>(),
        internal::StreamOf(xc)));
    return {y, rstd};
  }
#endif
  h = residual.defined() ? x + residual : x;
  const at::Tensor u = h.to(ComputeType(h));
  const at::Tensor rstd = at::rsqrt(u.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return {weight * (u * rstd).to(h.scalar_type()), rstd};
}

// Backward: {dh, dweight}; dh includes `dsum`. dy or dsum may be undefined.
std::pair<at::Tensor, at::Tensor> Backward(const at::Tensor& dy, const at::Tensor& dsum,
                                           const at::Tensor& h, const at::Tensor& rstd,
                                           const at::Tensor& weight, std::array<bool, 2> needed) {
  if (!dy.defined()) return {dsum, at::Tensor()};
  const int64_t cols = h.size(-1);
#ifdef FSDP2_KERNELS_CUDA
  if (UsesKernel(h, weight)) {
    const c10::cuda::CUDAGuard guard(h.device());
    const at::Tensor dyc = dy.to(h.scalar_type()).contiguous();
    const at::Tensor dsc = dsum.defined() ? dsum.to(h.scalar_type()).contiguous() : at::Tensor();
    const at::Tensor w = weight.to(at::kFloat).contiguous();
    const int64_t rows = h.numel() / cols;
    const cudaStream_t stream = internal::StreamOf(h);
    at::Tensor dh, dweight;
    if (needed[0]) {
      dh = at::empty(h.sizes(), h.options());
      FSDP2_KERNEL_CHECK(cuda::RmsNormBackwardInput(
          internal::ElementTypeOf(h), dyc.data_ptr(), dsc.defined() ? dsc.data_ptr() : nullptr,
          h.data_ptr(), rstd.data_ptr<float>(), w.data_ptr<float>(), rows, cols, dh.data_ptr(),
          stream));
    }
    if (needed[1]) {
      const int64_t parts = internal::ColumnSumParts(rows);
      at::Tensor weight_part = at::empty({parts, cols}, h.options().dtype(at::kFloat));
      FSDP2_KERNEL_CHECK(cuda::RmsNormBackwardWeight(internal::ElementTypeOf(h), dyc.data_ptr(),
                                                     h.data_ptr(), rstd.data_ptr<float>(), rows,
                                                     cols, parts, weight_part.data_ptr<float>(),
                                                     stream));
      dweight = weight_part.sum(0).to(weight.scalar_type());
    }
    return {dh, dweight};
  }
#endif
  // y = weight * n_T, n_T = (u * rstd) rounded to h's dtype, u = h in the
  // compute dtype. Each gradient is rounded where autograd would round it.
  const at::Tensor u = h.to(ComputeType(h));
  const at::Tensor n = u * rstd;
  at::Tensor dh, dweight;
  if (needed[0]) {
    const at::Tensor g = (dy * weight).to(h.scalar_type()).to(u.scalar_type());
    const at::Tensor du = rstd * (g - n * (g * n).mean(-1, /*keepdim=*/true));
    dh = du.to(h.scalar_type());
    if (dsum.defined()) dh = dh + dsum;
  }
  if (needed[1]) {
    const at::Tensor terms = dy * n.to(h.scalar_type());
    dweight = terms.reshape({-1, cols}).sum(0).to(weight.scalar_type());
  }
  return {dh, dweight};
}

// Inputs x, residual (optional), weight; outputs {y} without a residual,
// {y, h} with one. Which gradients to compute is read off the inputs in
// forward.
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const c10::optional<at::Tensor>& r, const at::Tensor& weight,
                               double eps) {
    ctx->set_materialize_grads(false);
    const at::Tensor residual = r.has_value() ? *r : at::Tensor();
    at::Tensor h;
    auto [y, rstd] = Forward(x, residual, weight, eps, h);
    ctx->save_for_backward({h, rstd, weight});
    ctx->saved_data["residual"] = residual.defined();
    ctx->saved_data["input_grad"] =
        x.requires_grad() || (residual.defined() && residual.requires_grad());
    ctx->saved_data["weight_grad"] = weight.requires_grad();
    if (!residual.defined()) return {y};
    return {y, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const bool residual = ctx->saved_data["residual"].toBool();
    auto [dh, dweight] =
        Backward(grads[0], residual ? grads[1] : at::Tensor(), saved[0], saved[1], saved[2],
                 {ctx->saved_data["input_grad"].toBool(), ctx->saved_data["weight_grad"].toBool()});
    return {dh, residual ? dh : at::Tensor(), dweight, at::Tensor()};
  }
};

void CheckWeight(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.defined() && weight.dim() == 1 && x.dim() >= 1 &&
                  weight.size(0) == x.size(-1),
              "RmsNorm: weight must be [", x.dim() >= 1 ? x.size(-1) : 0, "], got ",
              weight.defined() ? weight.sizes() : at::IntArrayRef{});
}

}  // namespace

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  CheckWeight(x, weight);
  return RmsNormFunction::apply(x, c10::optional<at::Tensor>(), weight, eps)[0];
}

AddNormResult AddRmsNorm(const at::Tensor& x, const at::Tensor& residual,
                         const at::Tensor& weight, double eps) {
  CheckWeight(x, weight);
  TORCH_CHECK(residual.defined() && residual.sizes() == x.sizes() &&
                  residual.scalar_type() == x.scalar_type() && residual.device() == x.device(),
              "AddRmsNorm: residual must match x (", x.sizes(), " ", x.scalar_type(), " on ",
              x.device(), ")");
  variable_list out = RmsNormFunction::apply(x, c10::optional<at::Tensor>(residual), weight, eps);
  return {out[1], out[0]};
}

at::Tensor RmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor u = x.to(ComputeType(x));
  const at::Tensor variance = u.pow(2).mean(-1, /*keepdim=*/true);
  u = u * at::rsqrt(variance + eps);
  return weight * u.to(x.scalar_type());
}

}  // namespace kernels
}  // namespace fsdp2
