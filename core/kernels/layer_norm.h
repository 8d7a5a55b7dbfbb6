// fsdp2/core/kernels/layer_norm.h
//
// LayerNorm over the last dimension, with the residual add in front of it
// fused in (a transformer block's `h = x + attn(...)` followed by
// `ln2(h)`): one pass over the rows forward, one for the input gradient
// and one column sum for the weight and bias gradients backward. On a CUDA
// tensor of float32 or bfloat16 it runs core/kernels/cuda/layer_norm.cu;
// elsewhere ATen's native_layer_norm and its backward (the composite).
// Both are differentiable through a torch::autograd::Function (no double
// backward).
#ifndef FSDP2_CORE_KERNELS_LAYER_NORM_H_
#define FSDP2_CORE_KERNELS_LAYER_NORM_H_

#include <ATen/core/Tensor.h>

namespace fsdp2 {
namespace kernels {

// The sum a residual add produces and the normalised sum.
struct AddNormResult {
  at::Tensor sum;     // x + residual, in x's dtype
  at::Tensor normed;  // the norm of `sum`
};

// at::layer_norm(x, {x.size(-1)}, weight, bias, eps). weight and bias are
// [x.size(-1)] or undefined; the output has x's shape and dtype.
at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     double eps = 1e-5);

// {x + residual, LayerNorm(x + residual)}, fused: the sum is rounded to x's
// dtype before it is normalised, as the composite stores it. x and residual
// have the same shape, dtype and device. Gradients reach x and residual
// from both results.
AddNormResult AddLayerNorm(const at::Tensor& x, const at::Tensor& residual,
                           const at::Tensor& weight, const at::Tensor& bias, double eps = 1e-5);

// The reference: the same in plain differentiable ATen ops.
AddNormResult AddLayerNormComposite(const at::Tensor& x, const at::Tensor& residual,
                                    const at::Tensor& weight, const at::Tensor& bias,
                                    double eps = 1e-5);

}  // namespace kernels
}  // namespace fsdp2

#endif  // FSDP2_CORE_KERNELS_LAYER_NORM_H_
