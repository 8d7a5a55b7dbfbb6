// fsdp2/core/kernels/internal/cuda_kernels.h
//
// The CUDA kernels of core/kernels, as plain functions over device pointers
// (core/kernels/cuda/*.cu, compiled by nvcc; no LibTorch on either side of
// this header). Each launches on `stream` and returns cudaGetLastError()
// after the launch; nothing waits for the device. Every matrix is row-major
// and contiguous, rows x cols, of `type`; statistics and weights are float.
// Callers are the entry points in core/kernels/*.cc, which check shapes,
// dtypes and devices before calling: these functions check nothing.
#ifndef FSDP2_CORE_KERNELS_INTERNAL_CUDA_KERNELS_H_
#define FSDP2_CORE_KERNELS_INTERNAL_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fsdp2 {
namespace kernels {
namespace cuda {

// The element types the kernels take.
enum class ElementType { kFloat32, kBFloat16 };

// Residual add and LayerNorm over each row: v = x (+ residual, rounded to
// `type`; then also written to h), y = (v - mean) * rstd * weight + bias.
// residual, h, weight and bias may be null (no residual, no affine).
// mean and rstd: [rows] float, kept for the backward.
cudaError_t LayerNormForward(ElementType type, const void* x, const void* residual,
                             const float* weight, const float* bias, int64_t rows,
                             int64_t cols, float eps, void* h, void* y, float* mean,
                             float* rstd, cudaStream_t stream);
// dx = LayerNorm's input gradient at h (rounded to `type`) + dh; dh and
// weight may be null.
cudaError_t LayerNormBackwardInput(ElementType type, const void* dy, const void* dh,
                                   const void* h, const float* mean, const float* rstd,
                                   const float* weight, int64_t rows, int64_t cols, void* dx,
                                   cudaStream_t stream);
// Partial column sums for the weight and bias gradients: parts x cols each
// (row r counts in part r % parts); the caller sums over parts. bias_part
// may be null.
cudaError_t LayerNormBackwardParams(ElementType type, const void* dy, const void* h,
                                    const float* mean, const float* rstd, int64_t rows,
                                    int64_t cols, int64_t parts, float* weight_part,
                                    float* bias_part, cudaStream_t stream);

// Residual add and RMSNorm (transformers' Llama): v = x (+ residual, rounded
// to `type`; also written to h), n = v * rstd rounded to `type`,
// y = weight * n rounded to `type`. rstd: [rows] float.
cudaError_t RmsNormForward(ElementType type, const void* x, const void* residual,
                           const float* weight, int64_t rows, int64_t cols, float eps, void* h,
                           void* y, float* rstd, cudaStream_t stream);
cudaError_t RmsNormBackwardInput(ElementType type, const void* dy, const void* dh,
                                 const void* h, const float* rstd, const float* weight,
                                 int64_t rows, int64_t cols, void* dx, cudaStream_t stream);
cudaError_t RmsNormBackwardWeight(ElementType type, const void* dy, const void* h,
                                  const float* rstd, int64_t rows, int64_t cols, int64_t parts,
                                  float* weight_part, cudaStream_t stream);

// GELU's backward at the pre-activation z (bias included), with the bias
// gradient in the same pass: dz = dy * gelu'(z) rounded to `type`, and
// bias_part[p][c] = the sum of dz[r][c] over the rows r of part p (r % parts
// == p) when bias_part is set. tanh: the tanh approximation, else erf.
cudaError_t GeluBackward(ElementType type, bool tanh, const void* dy, const void* z,
                         int64_t rows, int64_t cols, int64_t parts, void* dz, float* bias_part,
                         cudaStream_t stream);

// SwiGLU over n elements: y = silu(gate) * up, silu(gate) rounded to `type`
// first as ATen's composite stores it.
cudaError_t SwigluForward(ElementType type, const void* gate, const void* up, int64_t n,
                          void* y, cudaStream_t stream);
cudaError_t SwigluBackward(ElementType type, const void* dy, const void* gate, const void* up,
                           int64_t n, void* dgate, void* dup, cudaStream_t stream);

// A [batch, heads, seq, dim] tensor with unit stride in dim, and the
// strides of its first three dimensions.
struct RotaryLayout {
  int64_t batch, heads, seq, dim;
  int64_t in_stride[3];
  int64_t out_stride[3];
};
// Rotary embedding of each head, transformers' rotate_half convention, with
// cos and sin [seq, dim] contiguous; half = dim / 2, i < half:
//   forward:  out[i] = in[i] cos[i] - in[i+half] sin[i],
//             out[i+half] = in[i+half] cos[i+half] + in[i] sin[i+half];
//   backward (the transpose, for the input gradient):
//             out[i] = in[i] cos[i] + in[i+half] sin[i+half],
//             out[i+half] = in[i+half] cos[i+half] - in[i] sin[i].
cudaError_t Rotary(ElementType type, bool backward, const void* in, const void* cos,
                   const void* sin, const RotaryLayout& layout, void* out, cudaStream_t stream);

// Cross-entropy of each row of logits [rows, vocab] against targets
// [rows] (int64): losses[r] = logsumexp(logits[r]) - logits[r][t], 0 where
// t == ignore_index, NaN where t is outside [0, vocab). When grad_scale
// (one float on the device) is set, logits are overwritten with their
// gradient: (softmax(logits[r]) - onehot(t)) * grad_scale[0], 0 on ignored
// rows, rounded to `type`.
cudaError_t CrossEntropyRows(ElementType type, void* logits, const int64_t* targets,
                             int64_t rows, int64_t vocab, int64_t ignore_index,
                             const float* grad_scale, float* losses, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace fsdp2

#endif  // FSDP2_CORE_KERNELS_INTERNAL_CUDA_KERNELS_H_
