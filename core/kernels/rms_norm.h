// fsdp2/core/kernels/rms_norm.h
//
// RMSNorm as transformers' Llama computes it (the row in float32, float64
// staying float64, normalised, rounded to the input's dtype, then times the
// weight), with the residual add in front of it fused in. On a CUDA tensor
// of float32 or bfloat16 whose weight has the same dtype it runs
// core/kernels/cuda/rms_norm.cu; elsewhere the same formulas in ATen ops
// (the composite), forward and backward. Both are differentiable through a
// torch::autograd::Function (no double backward).
#ifndef FSDP2_CORE_KERNELS_RMS_NORM_H_
#define FSDP2_CORE_KERNELS_RMS_NORM_H_

#include <ATen/core/Tensor.h>

#include "core/kernels/layer_norm.h"

namespace fsdp2 {
namespace kernels {

// weight * (x / sqrt(mean(x^2 over the last dimension) + eps)), weight
// [x.size(-1)]: core/models/llama.cc's RMSNorm::forward. The output has the
// dtype weight * x promotes to.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// {x + residual, RmsNorm(x + residual)}, fused; x and residual have the
// same shape, dtype and device.
AddNormResult AddRmsNorm(const at::Tensor& x, const at::Tensor& residual,
                         const at::Tensor& weight, double eps);

// The reference: RmsNorm's formula in plain differentiable ATen ops.
at::Tensor RmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace kernels
}  // namespace fsdp2

#endif  // FSDP2_CORE_KERNELS_RMS_NORM_H_
