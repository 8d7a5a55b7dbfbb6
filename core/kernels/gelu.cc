#include "core/kernels/gelu.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

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

bool Tanh(const std::string& approximate) {
  TORCH_CHECK(approximate == "tanh" || approximate == "none",
              "LinearGelu: approximate must be \"tanh\" or \"none\", got \"", approximate, "\"");
  return approximate == "tanh";
}

// {dz, dbias}: GELU's backward at the pre-activation z, and the sum of dz
// over its rows when `want_bias`.
std::pair<at::Tensor, at::Tensor> GeluBackward(const at::Tensor& dy, const at::Tensor& z,
                                               const std::string& approximate, bool want_bias) {
  const int64_t cols = z.size(-1);
#ifdef FSDP2_KERNELS_CUDA
  if (RunsCudaKernel(z) && dy.scalar_type() == z.scalar_type() && z.numel() > 0) {
    const c10::cuda::CUDAGuard guard(z.device());
    const at::Tensor dyc = dy.contiguous(), zc = z.contiguous();
    const int64_t rows = zc.numel() / cols;
    const int64_t parts = internal::ColumnSumParts(rows);
    at::Tensor dz = at::empty(z.sizes(), zc.options());
    at::Tensor bias_part =
        want_bias ? at::empty({parts, cols}, zc.options().dtype(at::kFloat)) : at::Tensor();
    FSDP2_KERNEL_CHECK(cuda::GeluBackward(
        internal::ElementTypeOf(zc), Tanh(approximate), dyc.data_ptr(), zc.data_ptr(), rows, cols,
        parts, dz.data_ptr(), want_bias ? bias_part.data_ptr<float>() : nullptr,
        internal::StreamOf(zc)));
    return {dz, want_bias ? bias_part.sum(0).to(z.scalar_type()) : at::Tensor()};
  }
#endif
  at::Tensor dz = at::gelu_backward(dy, z, approximate);
  return {dz, want_bias ? dz.reshape({-1, cols}).sum(0) : at::Tensor()};
}

class LinearGeluFunction : public torch::autograd::Function<LinearGeluFunction> {
 public:
  // bias: optional (Function::apply takes no undefined tensor).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias,
                            const std::string& approximate) {
    const at::Tensor z = at::linear(x, weight, bias.has_value() ? *bias : at::Tensor());
    ctx->save_for_backward({x, weight, z});
    ctx->saved_data["approximate"] = approximate;
    ctx->saved_data["x_grad"] = x.requires_grad();
    ctx->saved_data["weight_grad"] = weight.requires_grad();
    ctx->saved_data["bias_type"] = static_cast<int64_t>(
        bias.has_value() && bias->requires_grad() ? bias->scalar_type()
                                                   : at::ScalarType::Undefined);
    return at::gelu(z, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& z = saved[2];
    const auto bias_type = static_cast<at::ScalarType>(ctx->saved_data["bias_type"].toInt());
    const bool want_bias = bias_type != at::ScalarType::Undefined;
    auto [dz, dbias] =
        GeluBackward(grads[0], z, ctx->saved_data["approximate"].toStringRef(), want_bias);
    at::Tensor dx, dweight;
    if (ctx->saved_data["x_grad"].toBool()) dx = at::matmul(dz, weight);
    if (ctx->saved_data["weight_grad"].toBool()) {
      dweight = at::mm(dz.reshape({-1, dz.size(-1)}).t(), x.reshape({-1, x.size(-1)}));
    }
    if (dbias.defined()) dbias = dbias.to(bias_type);
    return {dx, dweight, dbias, at::Tensor()};
  }
};

}  // namespace

at::Tensor LinearGelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      const std::string& approximate) {
  const bool tanh = Tanh(approximate);
  const bool grad = c10::GradMode::is_enabled() &&
                    (x.requires_grad() || weight.requires_grad() ||
                     (bias.defined() && bias.requires_grad()));
  if (!grad) {
    // One cuBLASLt call with the bias and GELU (tanh) epilogue where it
    // applies; the composite elsewhere.
    if (tanh && bias.defined() && RunsCudaKernel(x) && x.dim() >= 1 && x.numel() > 0 &&
        weight.scalar_type() == x.scalar_type() && bias.scalar_type() == x.scalar_type()) {
      const at::Tensor x2 = x.reshape({-1, x.size(-1)});
      at::Tensor y = at::_addmm_activation(bias, x2, weight.t(), 1, 1, /*use_gelu=*/true);
      std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
      shape.back() = weight.size(0);
      return y.view(shape);
    }
    return at::gelu(at::linear(x, weight, bias), approximate);
  }
  return LinearGeluFunction::apply(
      x, weight, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, approximate);
}

at::Tensor LinearGeluComposite(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, const std::string& approximate) {
  return at::gelu(at::linear(x, weight, bias), approximate);
}

}  // namespace kernels
}  // namespace fsdp2
