// fsdp2/core/kernels/gelu.h
//
// A linear layer followed by GELU, y = gelu(x @ weight^T + bias), with the
// bias and the activation fused into the matrix multiplications:
//  - forward: the bias is added in the GEMM (addmm; on CUDA cuBLASLt's bias
//    epilogue), then ATen's gelu; without gradients, on CUDA with the tanh
//    approximation, the whole layer is one cuBLASLt call with its GELU
//    epilogue (at::_addmm_activation);
//  - backward: GELU's derivative and the bias gradient in one pass over the
//    pre-activation (core/kernels/cuda/gelu.cu on a CUDA tensor of float32
//    or bfloat16; at::gelu_backward and a sum elsewhere), then the two
//    GEMMs of the layer's gradients.
// Differentiable through a torch::autograd::Function (no double backward).
#ifndef FSDP2_CORE_KERNELS_GELU_H_
#define FSDP2_CORE_KERNELS_GELU_H_

#include <ATen/core/Tensor.h>

#include <string>

namespace fsdp2 {
namespace kernels {

// gelu(linear(x, weight, bias), approximate): x [..., in], weight [out, in],
// bias [out] or undefined; approximate "tanh" (GPT-2's) or "none" (erf).
at::Tensor LinearGelu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      const std::string& approximate = "tanh");

// The reference: the same in plain differentiable ATen ops.
at::Tensor LinearGeluComposite(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, const std::string& approximate = "tanh");

}  // namespace kernels
}  // namespace fsdp2

#endif  // FSDP2_CORE_KERNELS_GELU_H_
