// fsdp2/core/kernels/cuda/cross_entropy.cu
//
// Cross-entropy of each row of a logits chunk, and its gradient written over
// the logits (the CUDA side of core/kernels/linear_cross_entropy.cc, after
// llm.c's fused_classifier): one block a row reads the row three times (max,
// sum of exponentials, gradient), all in float, so the chunk's logits never
// exist in float32 and the gradient needs no memory of its own.
#include "core/kernels/cuda/common.cuh"
#include "core/kernels/internal/cuda_kernels.h"

namespace fsdp2 {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 512;

template <typename T>
__global__ void CrossEntropyRowsKernel(T* __restrict__ logits, const int64_t* __restrict__ targets,
                                       int64_t vocab, int64_t ignore_index,
                                       const float* __restrict__ grad_scale,
                                       float* __restrict__ losses) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  T* z = logits + row * vocab;
  const int64_t target = targets[row];
  const bool ignored = target == ignore_index;
  const bool valid = !ignored && target >= 0 && target < vocab;

  float max = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) max = fmaxf(max, ToFloat(z[i]));
  max = BlockMax<kThreads>(max, scratch);
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) sum += expf(ToFloat(z[i]) - max);
  sum = BlockSum<kThreads>(sum, scratch);
  const float lse = max + logf(sum);
  // Every thread reads z[target] before any thread overwrites it below.
  const float picked = valid ? ToFloat(z[target]) : 0.f;
  if (threadIdx.x == 0) losses[row] = ignored ? 0.f : valid ? lse - picked : NAN;
  if (grad_scale == nullptr) return;
  __syncthreads();
  const float scale = ignored ? 0.f : valid ? grad_scale[0] : NAN;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float p = expf(ToFloat(z[i]) - lse);
    z[i] = FromFloat<T>((p - (i == target ? 1.f : 0.f)) * scale);
  }
}

template <typename T>
cudaError_t Launch(void* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                   int64_t ignore_index, const float* grad_scale, float* losses,
                   cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  CrossEntropyRowsKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      static_cast<T*>(logits), targets, vocab, ignore_index, grad_scale, losses);
  return cudaGetLastError();
}

}  // namespace

cudaError_t CrossEntropyRows(ElementType type, void* logits, const int64_t* targets,
                             int64_t rows, int64_t vocab, int64_t ignore_index,
                             const float* grad_scale, float* losses, cudaStream_t stream) {
  return type == ElementType::kBFloat16
             ? Launch<__nv_bfloat16>(logits, targets, rows, vocab, ignore_index, grad_scale,
                                     losses, stream)
             : Launch<float>(logits, targets, rows, vocab, ignore_index, grad_scale, losses,
                             stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace fsdp2
