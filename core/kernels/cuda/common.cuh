// fsdp2/core/kernels/cuda/common.cuh
//
// What the kernels of core/kernels/cuda share: loads and stores of the two
// element types they take (float and bfloat16, every value computed in
// float), warp and block sums, and the column sums of the norms' weight
// gradients. CUDA toolkit headers only: no LibTorch here.
#ifndef FSDP2_CORE_KERNELS_CUDA_COMMON_CUH_
#define FSDP2_CORE_KERNELS_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fsdp2 {
namespace kernels {
namespace cuda {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

// Rounds to the nearest representable value, ties to even, as ATen's
// conversions do.
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// `v` rounded to T and back: where ATen's composite stores an intermediate
// in the tensor's dtype, the kernels round at the same place.
template <typename T>
__device__ __forceinline__ float Round(float v) {
  return ToFloat(FromFloat<T>(v));
}

// The sum over the 32 lanes of a warp, in every lane.
__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The sum over a block of kThreads threads (a multiple of 32, at most 1024),
// in every thread. `scratch` holds 32 floats of shared memory; the call
// synchronises the block, so all threads must make it.
template <int kThreads>
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? scratch[lane] : 0.f;
  return WarpSum(v);
}

template <int kThreads>
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? scratch[lane] : -INFINITY;
  return WarpMax(v);
}

// Column sums of a norm's weight (and bias) gradients, in parts: block
// (bx, by) sums columns [32 bx, 32 bx + 32) over the rows of part by (rows
// by, by + parts, by + 2 parts, ...), and writes
//   weight_part[by][c] = sum of term(dy[r][c], h[r][c], r)
//   bias_part[by][c]   = sum of dy[r][c]          (when bias_part is set)
// where term gives the weight gradient's summand (dy times the normalised
// value of h at row r). The caller sums the parts in a fixed order: the
// result does not depend on timing. Blocks are 32 x 8 threads: a warp reads
// 32 neighbouring columns of a row.
template <typename T, typename Term>
__global__ void NormParamGradKernel(const T* __restrict__ dy, const T* __restrict__ h,
                                    Term term, int64_t rows, int64_t cols,
                                    float* __restrict__ weight_part,
                                    float* __restrict__ bias_part) {
  __shared__ float weight_sum[8][33];
  __shared__ float bias_sum[8][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t parts = gridDim.y;
  float w = 0.f, b = 0.f;
  if (c < cols) {
    for (int64_t r = int64_t(blockIdx.y) + parts * threadIdx.y; r < rows; r += parts * 8) {
      const float g = ToFloat(dy[r * cols + c]);
      w += term(g, ToFloat(h[r * cols + c]), r);
      b += g;
    }
  }
  weight_sum[threadIdx.y][threadIdx.x] = w;
  bias_sum[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int i = 1; i < 8; ++i) {
      w += weight_sum[i][threadIdx.x];
      b += bias_sum[i][threadIdx.x];
    }
    weight_part[int64_t(blockIdx.y) * cols + c] = w;
    if (bias_part != nullptr) bias_part[int64_t(blockIdx.y) * cols + c] = b;
  }
}

inline unsigned Blocks(int64_t work, int64_t per_block) {
  return static_cast<unsigned>((work + per_block - 1) / per_block);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace fsdp2

#endif  // FSDP2_CORE_KERNELS_CUDA_COMMON_CUH_
