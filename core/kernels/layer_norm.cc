#include "core/kernels/layer_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <tuple>

#include "core/kernels/dispatch.h"
#ifdef FSDP2_KERNELS_CUDA
#include "core/kernels/internal/cuda_launch.h"
#endif

namespace fsdp2 {
namespace kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = c10::optional<at::Tensor>;

// Function::apply takes an undefined tensor only as an empty optional.
OptionalTensor Optional(const at::Tensor& t) {
  return t.defined() ? OptionalTensor(t) : c10::nullopt;
}
at::Tensor Value(const OptionalTensor& t) { return t.has_value() ? *t : at::Tensor(); }
bool RequiresGrad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }

bool UsesKernel(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                const at::Tensor& bias) {
  auto fits = [&](const at::Tensor& t) {
    return !t.defined() || (t.device() == x.device() &&
                            (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16));
  };
  return RunsCudaKernel(x) && x.dim() >= 1 && x.numel() > 0 &&
         (!residual.defined() || (residual.scalar_type() == x.scalar_type() &&
                                  residual.device() == x.device())) &&
         fits(weight) && fits(bias);
}

// Forward: {y, mean, rstd}, with h = x (+ residual) written to `h`.
std::tuple<at::Tensor, at::Tensor, at::Tensor> Forward(const at::Tensor& x,
                                                       const at::Tensor& residual,
                                                       const at::Tensor& weight,
                                                       const at::Tensor& bias, double eps,
                                                       at::Tensor& h) {
  const int64_t cols = x.size(-1);
#ifdef FSDP2_KERNELS_CUDA
  if (UsesKernel(x, residual, weight, bias)) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous();
    const at::Tensor rc = residual.defined() ? residual.contiguous() : at::Tensor();
    const at::Tensor w = weight.defined() ? weight.to(at::kFloat).contiguous() : at::Tensor();
    const at::Tensor b = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
    const int64_t rows = xc.numel() / cols;
    h = residual.defined() ? at::empty(x.sizes(), xc.options()) : xc;
    at::Tensor y = at::empty(x.sizes(), xc.options());
    at::Tensor mean = at::empty({rows}, xc.options().dtype(at::kFloat));
    at::Tensor rstd = at::empty({rows}, xc.options().dtype(at::kFloat));
    FSDP2_KERNEL_CHECK(cuda::LayerNormForward(
        internal::ElementTypeOf(xc), xc.data_ptr(), rc.defined() ? rc.data_ptr() : nullptr,
        w.defined() ? w.data_ptr<float>() : nullptr, b.defined() ? b.data_ptr<float>() : nullptr,
        rows, cols, static_cast<float>(eps), residual.defined() ? h.data_ptr() : nullptr,
        y.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(), internal::StreamOf(xc)));
    return {y, mean, rstd};
  }
#endif
  h = residual.defined() ? x + residual : x;
  return at::native_layer_norm(h, {cols}, weight, bias, eps);
}

// Backward: {dh, dweight, dbias}; dh includes `dsum`, the gradient that
// reached the sum directly. dy or dsum may be undefined (no gradient).
std::tuple<at::Tensor, at::Tensor, at::Tensor> Backward(
    const at::Tensor& dy, const at::Tensor& dsum, const at::Tensor& h, const at::Tensor& mean,
    const at::Tensor& rstd, const at::Tensor& weight, const at::Tensor& bias,
    std::array<bool, 3> needed) {
  if (!dy.defined()) return {dsum, at::Tensor(), at::Tensor()};
  const int64_t cols = h.size(-1);
#ifdef FSDP2_KERNELS_CUDA
  if (UsesKernel(h, at::Tensor(), weight, bias)) {
    const c10::cuda::CUDAGuard guard(h.device());
    const at::Tensor dyc = dy.to(h.scalar_type()).contiguous();
    const at::Tensor dsc = dsum.defined() ? dsum.to(h.scalar_type()).contiguous() : at::Tensor();
    const at::Tensor w = weight.defined() ? weight.to(at::kFloat).contiguous() : at::Tensor();
    const int64_t rows = h.numel() / cols;
    const cudaStream_t stream = internal::StreamOf(h);
    at::Tensor dh;
    if (needed[0]) {
      dh = at::empty(h.sizes(), h.options());
      FSDP2_KERNEL_CHECK(cuda::LayerNormBackwardInput(
          internal::ElementTypeOf(h), dyc.data_ptr(), dsc.defined() ? dsc.data_ptr() : nullptr,
          h.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
          w.defined() ? w.data_ptr<float>() : nullptr, rows, cols, dh.data_ptr(), stream));
    }
    at::Tensor dweight, dbias;
    const bool want_w = needed[1] && weight.defined(), want_b = needed[2] && bias.defined();
    if (want_w || want_b) {
      const int64_t parts = internal::ColumnSumParts(rows);
      at::Tensor weight_part = at::empty({parts, cols}, h.options().dtype(at::kFloat));
      at::Tensor bias_part =
          want_b ? at::empty({parts, cols}, weight_part.options()) : at::Tensor();
      FSDP2_KERNEL_CHECK(cuda::LayerNormBackwardParams(
          internal::ElementTypeOf(h), dyc.data_ptr(), h.data_ptr(), mean.data_ptr<float>(),
          rstd.data_ptr<float>(), rows, cols, parts, weight_part.data_ptr<float>(),
          want_b ? bias_part.data_ptr<float>() : nullptr, stream));
      if (want_w) dweight = weight_part.sum(0).to(weight.scalar_type());
      if (want_b) dbias = bias_part.sum(0).to(bias.scalar_type());
    }
    return {dh, dweight, dbias};
  }
#endif
  auto grads = at::native_layer_norm_backward(dy, h, {cols}, mean, rstd, weight, bias,
                                              {needed[0], needed[1] && weight.defined(),
                                               needed[2] && bias.defined()});
  at::Tensor dh = std::get<0>(grads);
  if (dh.defined() && dsum.defined()) dh = dh + dsum;
  return {dh, std::get<1>(grads), std::get<2>(grads)};
}

// Inputs x, residual, weight, bias (the last three optional); outputs {y}
// without a residual, {y, h} with one. Which gradients to compute is read
// off the inputs in forward.
class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const OptionalTensor& r,
                               const OptionalTensor& w, const OptionalTensor& b, double eps) {
    ctx->set_materialize_grads(false);
    const at::Tensor residual = Value(r), weight = Value(w), bias = Value(b);
    at::Tensor h;
    auto [y, mean, rstd] = Forward(x, residual, weight, bias, eps, h);
    ctx->save_for_backward({h, mean, rstd, weight, bias});
    ctx->saved_data["residual"] = residual.defined();
    ctx->saved_data["input_grad"] = RequiresGrad(x) || RequiresGrad(residual);
    ctx->saved_data["weight_grad"] = RequiresGrad(weight);
    ctx->saved_data["bias_grad"] = RequiresGrad(bias);
    if (!residual.defined()) return {y};
    return {y, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const bool residual = ctx->saved_data["residual"].toBool();
    const at::Tensor dsum = residual ? grads[1] : at::Tensor();
    auto [dh, dweight, dbias] = Backward(
        grads[0], dsum, saved[0], saved[1], saved[2], saved[3], saved[4],
        {ctx->saved_data["input_grad"].toBool(), ctx->saved_data["weight_grad"].toBool(),
         ctx->saved_data["bias_grad"].toBool()});
    return {dh, residual ? dh : at::Tensor(), dweight, dbias, at::Tensor()};
  }
};

}  // namespace

// The affine parameters' sizes, checked before a kernel could read past
// them (the composite would throw).
static void CheckAffine(const char* what, const at::Tensor& x, const at::Tensor& weight,
                 const at::Tensor& bias) {
  TORCH_CHECK(x.dim() >= 1, what, ": x must have a last dimension");
  TORCH_CHECK((!weight.defined() || weight.numel() == x.size(-1)) &&
                  (!bias.defined() || bias.numel() == x.size(-1)),
              what, ": weight and bias must have ", x.size(-1), " elements (x's last dimension)");
}

at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     double eps) {
  CheckAffine("LayerNorm", x, weight, bias);
  return LayerNormFunction::apply(x, OptionalTensor(), Optional(weight), Optional(bias), eps)[0];
}

AddNormResult AddLayerNorm(const at::Tensor& x, const at::Tensor& residual,
                           const at::Tensor& weight, const at::Tensor& bias, double eps) {
  CheckAffine("AddLayerNorm", x, weight, bias);
  TORCH_CHECK(residual.defined() && residual.sizes() == x.sizes() &&
                  residual.scalar_type() == x.scalar_type() && residual.device() == x.device(),
              "AddLayerNorm: residual must match x (", x.sizes(), " ", x.scalar_type(), " on ",
              x.device(), "), got ",
              residual.defined() ? residual.sizes() : at::IntArrayRef{}, " ",
              residual.defined() ? residual.scalar_type() : at::ScalarType::Undefined);
  variable_list out =
      LayerNormFunction::apply(x, Optional(residual), Optional(weight), Optional(bias), eps);
  return {out[1], out[0]};
}

AddNormResult AddLayerNormComposite(const at::Tensor& x, const at::Tensor& residual,
                                    const at::Tensor& weight, const at::Tensor& bias,
                                    double eps) {
  at::Tensor h = x + residual;
  return {h, at::layer_norm(h, {x.size(-1)}, weight, bias, eps)};
}

}  // namespace kernels
}  // namespace fsdp2
