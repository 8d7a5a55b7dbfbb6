// fsdp2/core/kernels/cuda/layer_norm.cu
//
// Residual add + LayerNorm, forward and backward (the CUDA side of
// core/kernels/layer_norm.cc). One warp a row: the forward reads the row
// three times (mean, variance, output; the row stays in L1/L2), all in
// float; the backward's input gradient is a second row kernel, and the
// weight and bias gradients column sums in parts (common.cuh).
#include "core/kernels/cuda/common.cuh"
#include "core/kernels/internal/cuda_kernels.h"

namespace fsdp2 {
namespace kernels {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// The row's input value at column c: x + residual rounded to T, as the
// composite's add stores it.
template <typename T>
__device__ __forceinline__ float Input(const T* x, const T* residual, int64_t i) {
  if (residual == nullptr) return ToFloat(x[i]);
  return Round<T>(ToFloat(x[i]) + ToFloat(residual[i]));
}

template <typename T>
__global__ void LayerNormForwardKernel(const T* __restrict__ x, const T* __restrict__ residual,
                                       const float* __restrict__ weight,
                                       const float* __restrict__ bias, int64_t rows,
                                       int64_t cols, float eps, T* __restrict__ h,
                                       T* __restrict__ y, float* __restrict__ mean_out,
                                       float* __restrict__ rstd_out) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t base = row * cols;
  float sum = 0.f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float v = Input(x, residual, base + c);
    if (h != nullptr) h[base + c] = FromFloat<T>(v);
    sum += v;
  }
  const float mean = WarpSum(sum) / float(cols);
  float squares = 0.f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float d = Input(x, residual, base + c) - mean;
    squares += d * d;
  }
  const float rstd = rsqrtf(WarpSum(squares) / float(cols) + eps);
  for (int64_t c = lane; c < cols; c += 32) {
    float v = (Input(x, residual, base + c) - mean) * rstd;
    if (weight != nullptr) v *= weight[c];
    if (bias != nullptr) v += bias[c];
    y[base + c] = FromFloat<T>(v);
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight, the
// formula of ATen's layer_norm backward; rounded to T, then dh added.
template <typename T>
__global__ void LayerNormBackwardInputKernel(const T* __restrict__ dy, const T* __restrict__ dh,
                                             const T* __restrict__ h,
                                             const float* __restrict__ mean_in,
                                             const float* __restrict__ rstd_in,
                                             const float* __restrict__ weight, int64_t rows,
                                             int64_t cols, T* __restrict__ dx) {
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t base = row * cols;
  const float mean = mean_in[row], rstd = rstd_in[row];
  float sum_g = 0.f, sum_gx = 0.f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float g = ToFloat(dy[base + c]) * (weight != nullptr ? weight[c] : 1.f);
    sum_g += g;
    sum_gx += g * (ToFloat(h[base + c]) - mean) * rstd;
  }
  const float mean_g = WarpSum(sum_g) / float(cols);
  const float mean_gx = WarpSum(sum_gx) / float(cols);
  for (int64_t c = lane; c < cols; c += 32) {
    const float g = ToFloat(dy[base + c]) * (weight != nullptr ? weight[c] : 1.f);
    const float xhat = (ToFloat(h[base + c]) - mean) * rstd;
    float d = Round<T>((g - mean_g - xhat * mean_gx) * rstd);
    if (dh != nullptr) d += ToFloat(dh[base + c]);
    dx[base + c] = FromFloat<T>(d);
  }
}

// dy times the standardised input, in float as ATen's backward sums it.
struct WeightTerm {
  const float* mean;
  const float* rstd;
  __device__ float operator()(float dy, float h, int64_t row) const {
    return dy * (h - mean[row]) * rstd[row];
  }
};

template <typename T>
cudaError_t Forward(const void* x, const void* residual, const float* weight, const float* bias,
                    int64_t rows, int64_t cols, float eps, void* h, void* y, float* mean,
                    float* rstd, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LayerNormForwardKernel<T><<<Blocks(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(residual), weight, bias, rows, cols, eps,
      static_cast<T*>(h), static_cast<T*>(y), mean, rstd);
  return cudaGetLastError();
}

template <typename T>
cudaError_t BackwardInput(const void* dy, const void* dh, const void* h, const float* mean,
                          const float* rstd, const float* weight, int64_t rows, int64_t cols,
                          void* dx, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LayerNormBackwardInputKernel<T>
      <<<Blocks(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
          static_cast<const T*>(dy), static_cast<const T*>(dh), static_cast<const T*>(h), mean,
          rstd, weight, rows, cols, static_cast<T*>(dx));
  return cudaGetLastError();
}

template <typename T>
cudaError_t BackwardParams(const void* dy, const void* h, const float* mean, const float* rstd,
                           int64_t rows, int64_t cols, int64_t parts, float* weight_part,
                           float* bias_part, cudaStream_t stream) {
  const dim3 grid(Blocks(cols, 32), static_cast<unsigned>(parts));
  NormParamGradKernel<T><<<grid, dim3(32, 8), 0, stream>>>(
      static_cast<const T*>(dy), static_cast<const T*>(h), WeightTerm{mean, rstd}, rows, cols,
      weight_part, bias_part);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LayerNormForward(ElementType type, const void* x, const void* residual,
                             const float* weight, const float* bias, int64_t rows,
                             int64_t cols, float eps, void* h, void* y, float* mean,
                             float* rstd, cudaStream_t stream) {
  return type == ElementType::kBFloat16
             ? Forward<__nv_bfloat16>(x, residual, weight, bias, rows, cols, eps, h, y, mean,
                                      rstd, stream)
             : Forward<float>(x, residual, weight, bias, rows, cols, eps, h, y, mean, rstd,
                              stream);
}

cudaError_t LayerNormBackwardInput(ElementType type, const void* dy, const void* dh,
                                   const void* h, const float* mean, const float* rstd,
                                   const float* weight, int64_t rows, int64_t cols, void* dx,
                                   cudaStream_t stream) {
  return type == ElementType::kBFloat16
             ? BackwardInput<__nv_bfloat16>(dy, dh, h, mean, rstd, weight, rows, cols, dx,
                                            stream)
             : BackwardInput<float>(dy, dh, h, mean, rstd, weight, rows, cols, dx, stream);
}

cudaError_t LayerNormBackwardParams(ElementType type, const void* dy, const void* h,
                                    const float* mean, const float* rstd, int64_t rows,
                                    int64_t cols, int64_t parts, float* weight_part,
                                    float* bias_part, cudaStream_t stream) {
  return type == ElementType::kBFloat16
             ? BackwardParams<__nv_bfloat16>(dy, h, mean, rstd, rows, cols, parts, weight_part,
                                             bias_part, stream)
             : BackwardParams<float>(dy, h, mean, rstd, rows, cols, parts, weight_part,
                                     bias_part, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace fsdp2
