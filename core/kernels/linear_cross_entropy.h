// fsdp2/core/kernels/linear_cross_entropy.h
//
// A language model's output projection and its loss, fused and chunked:
// mean cross-entropy of x @ weight^T against targets, computed a chunk of
// rows (tokens) at a time so that the logits of the whole batch never exist
// (at vocabulary 50,304 and 32 x 1024 tokens, their float32 copy alone is
// 6.6 GB). Each chunk's logits are made in x's dtype by one GEMM; the loss
// of each row and the gradient of the logits are computed in one pass over
// them, written over them (core/kernels/cuda/cross_entropy.cu on CUDA
// tensors of float32 or bfloat16; ATen ops elsewhere), and the gradients of
// x and weight follow from two GEMMs on the chunk while it is at hand. The
// forward therefore computes the gradients (when x or weight requires
// them) and the backward only scales them by the loss's gradient: memory
// holds x's gradient and weight's, in float32 (float64 for float64), never
// more than one chunk of logits.
// Differentiable through a torch::autograd::Function (no double backward).
#ifndef FSDP2_CORE_KERNELS_LINEAR_CROSS_ENTROPY_H_
#define FSDP2_CORE_KERNELS_LINEAR_CROSS_ENTROPY_H_

#include <ATen/core/Tensor.h>

namespace fsdp2 {
namespace kernels {

struct LinearCrossEntropyOptions {
  // Targets equal to it count in neither the loss nor the mean's divisor
  // (PyTorch's cross_entropy default).
  int64_t ignore_index = -100;
  // Rows per chunk; 0 (default): as many as keep a chunk's logits, in x's
  // dtype, within 256 MiB (2,668 rows at vocabulary 50,304 in bfloat16).
  int64_t chunk_rows = 0;
};

// cross_entropy(linear(x, weight), targets), mean over the targets that are
// not ignore_index (NaN when all are): x [..., C], weight [V, C] of x's
// dtype, targets [...] (integers, x's leading shape). The logits are made
// in x's dtype and the loss computed from them in float32 (float64 for
// float64), as autocast computes cross_entropy; the scalar returned has
// that dtype. A target outside [0, V) that is not ignore_index throws on
// the CPU, as ATen does; a CUDA kernel cannot throw, and makes the loss NaN
// instead.
at::Tensor LinearCrossEntropy(const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& targets,
                              const LinearCrossEntropyOptions& options = {});

// The reference: the same in plain differentiable ATen ops, holding every
// row's logits (cast to float32 for the loss when x is bfloat16 or
// float16).
at::Tensor LinearCrossEntropyComposite(const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& targets, int64_t ignore_index = -100);

}  // namespace kernels
}  // namespace fsdp2

#endif  // FSDP2_CORE_KERNELS_LINEAR_CROSS_ENTROPY_H_
