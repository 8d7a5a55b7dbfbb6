// fsdp2/core/kernels/cuda/rms_norm.cu
//
// Residual add + RMSNorm, forward and backward (the CUDA side of
// core/kernels/rms_norm.cc), rounding where transformers' Llama RMSNorm
// stores in the activations' dtype: the normalised row before the weight
// multiplies it, and the product. One warp a row; the weight gradient is a
// column sum in parts (common.cuh).
#include "core/kernels/cuda/common.cuh"
#include "core/kernels/internal/cuda_kernels.h"

namespace fsdp2 {
namespace kernels {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

template <typename T>
__device__ __forceinline__ float Input(const T* x, const T* residual, int64_t i) {
  if (residual == nullptr) return ToFloat(x[i]);
  return Round<T>(ToFloat(x[i]) + ToFloat(residual[i]));
}

template <typename T>
__global__ void RmsNormForwardKernel(const T* __restrict__ x, const T* __restrict__ residual,
                                     const float* __restrict__ weight, int64_t rows,
                                     int64_t cols, float eps, T* __restrict__ h,
                                     T* __restrict__ y, float* __restrict__ rstd_out) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t base = row * cols;
  float squares = 0.f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float v = Input(x, residual, base + c);
    if (h != nullptr) h[base + c] = FromFloat<T>(v);
    squares += v * v;
  }
  const float rstd = rsqrtf(WarpSum(squares) / float(cols) + eps);
  for (int64_t c = lane; c < cols; c += 32) {
    const float n = Round<T>(Input(x, residual, base + c) * rstd);
    y[base + c] = FromFloat<T>(weight[c] * n);
  }
  if (lane == 0) rstd_out[row] = rstd;
}

// With n = v * rstd and g = dy * weight (rounded to T, as the composite's
// product is): dv = rstd * (g - n * mean(g * n)), rounded to T, then dh
// added.
template <typename T>
__global__ void RmsNormBackwardInputKernel(const T* __restrict__ dy, const T* __restrict__ dh,
                                           const T* __restrict__ h,
                                           const float* __restrict__ rstd_in,
                                           const float* __restrict__ weight, int64_t rows,
                                           int64_t cols, T* __restrict__ dx) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t base = row * cols;
  const float rstd = rstd_in[row];
  float sum_gn = 0.f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float g = Round<T>(ToFloat(dy[base + c]) * weight[c]);
    sum_gn += g * ToFloat(h[base + c]) * rstd;
  }
  const float mean_gn = WarpSum(sum_gn) / float(cols);
  for (int64_t c = lane; c < cols; c += 32) {
    const float g = Round<T>(ToFloat(dy[base + c]) * weight[c]);
    const float n = ToFloat(h[base + c]) * rstd;
    float d = Round<T>(rstd * (g - n * mean_gn));
    if (dh != nullptr) d += ToFloat(dh[base + c]);
    dx[base + c] = FromFloat<T>(d);
  }
}

// The weight gradient's summand as the composite forms it: dy times the
// stored (rounded) normalised value, the product rounded to T.
template <typename T>
struct WeightTerm {
  const float* rstd;
  __device__ float operator()(float dy, float h, int64_t row) const {
    return Round<T>(dy * Round<T>(h * rstd[row]));
  }
};

template <typename T>
cudaError_t Forward(const void* x, const void* residual, const float* weight, int64_t rows,
                    int64_t cols, float eps, void* h, void* y, float* rstd, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RmsNormForwardKernel<T><<<Blocks(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(residual), weight, rows, cols, eps,
      static_cast<T*>(h), static_cast<T*>(y), rstd);
  return cudaGetLastError();
}

template <typename T>
cudaError_t BackwardInput(const void* dy, const void* dh, const void* h, const float* rstd,
                          const float* weight, int64_t rows, int64_t cols, void* dx,
                          cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RmsNormBackwardInputKernel<T><<<Blocks(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<const T*>(dy), static_cast<const T*>(dh), static_cast<const T*>(h), rstd,
      weight, rows, cols, static_cast<T*>(dx));
  return cudaGetLastError();
}

template <typename T>
cudaError_t BackwardWeight(const void* dy, const void* h, const float* rstd, int64_t rows,
                           int64_t cols, int64_t parts, float* weight_part, cudaStream_t stream) {
  const dim3 grid(Blocks(cols, 32), static_cast<unsigned>(parts));
  NormParamGradKernel<T><<<grid, dim3(32, 8), 0, stream>>>(
      static_cast<const T*>(dy), static_cast<const T*>(h), WeightTerm<T>{rstd}, rows, cols,
      weight_part, nullptr);
  return cudaGetLastError();
}

}  // namespace

cudaError_t RmsNormForward(ElementType type, const void* x, const void* residual,
                           const float* weight, int64_t rows, int64_t cols, float eps, void* h,
                           void* y, float* rstd, cudaStream_t stream) {
  return type == ElementType::kBFloat16
             ? Forward<__nv_bfloat16>(x, residual, weight, rows, cols, eps, h, y, rstd, stream)
             : Forward<float>(x, residual, weight, rows, cols, eps, h, y, rstd, stream);
}

cudaError_t RmsNormBackwardInput(ElementType type, const void* dy, const void* dh,
                                 const void* h, const float* rstd, const float* weight,
                                 int64_t rows, int64_t cols, void* dx, cudaStream_t stream) {
  return type == ElementType::kBFloat16
             ? BackwardInput<__nv_bfloat16>(dy, dh, h, rstd, weight, rows, cols, dx, stream)
             : BackwardInput<float>(dy, dh, h, rstd, weight, rows, cols, dx, stream);
}

cudaError_t RmsNormBackwardWeight(ElementType type, const void* dy, const void* h,
                                  const float* rstd, int64_t rows, int64_t cols, int64_t parts,
                                  float* weight_part, cudaStream_t stream) {
  return type == ElementType::kBFloat16
             ? BackwardWeight<__nv_bfloat16>(dy, h, rstd, rows, cols, parts, weight_part, stream)
             : BackwardWeight<float>(dy, h, rstd, rows, cols, parts, weight_part, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace fsdp2
