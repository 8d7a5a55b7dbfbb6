// fsdp2/core/kernels/rotary.h
//
// Rotary position embeddings (RoPE) in transformers' rotate_half
// convention, forward and backward each one elementwise pass over the heads
// (core/kernels/cuda/rotary.cu on CUDA tensors of float32 or bfloat16,
// strided views included; ATen ops elsewhere). The cos and sin tables are
// constants: no gradient reaches them. Differentiable in x through a
// torch::autograd::Function (no double backward).
#ifndef FSDP2_CORE_KERNELS_ROTARY_H_
#define FSDP2_CORE_KERNELS_ROTARY_H_

#include <ATen/core/Tensor.h>

namespace fsdp2 {
namespace kernels {

// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) over the
// halves of the last dimension: x [batch, heads, seq, dim] (dim even), cos
// and sin [seq, dim] in x's dtype, as core/models/llama.cc's RotaryTables
// gives them. Other shapes, and tables that require grad, take the
// composite (which then also gives their gradients).
at::Tensor Rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The reference: the same in plain differentiable ATen ops.
at::Tensor RotaryComposite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace kernels
}  // namespace fsdp2

#endif  // FSDP2_CORE_KERNELS_ROTARY_H_
