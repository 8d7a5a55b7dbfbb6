// fsdp2/core/kernels/swiglu.h
//
// SwiGLU, the gate of the Llama family's MLP: silu(gate) * up, forward and
// backward each one elementwise pass (core/kernels/cuda/swiglu.cu on CUDA
// tensors of float32 or bfloat16; ATen's silu, silu_backward and products
// elsewhere). Differentiable through a torch::autograd::Function (no
// double backward).
#ifndef FSDP2_CORE_KERNELS_SWIGLU_H_
#define FSDP2_CORE_KERNELS_SWIGLU_H_

#include <ATen/core/Tensor.h>

namespace fsdp2 {
namespace kernels {

// silu(gate) * up; gate and up have the same shape, dtype and device.
at::Tensor Swiglu(const at::Tensor& gate, const at::Tensor& up);

// The reference: the same in plain differentiable ATen ops.
at::Tensor SwigluComposite(const at::Tensor& gate, const at::Tensor& up);

}  // namespace kernels
}  // namespace fsdp2

#endif  // FSDP2_CORE_KERNELS_SWIGLU_H_
