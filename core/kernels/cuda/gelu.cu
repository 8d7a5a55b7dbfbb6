// fsdp2/core/kernels/cuda/gelu.cu
//
// GELU's backward with its bias gradient in the same pass (the CUDA side of
// core/kernels/gelu.cc): each thread walks down one column, writes dz and
// sums it, so the bias gradient costs no second read of dz. The derivative
// is computed as ATen's gelu_backward computes it, in float.
#include "core/kernels/cuda/common.cuh"
#include "core/kernels/internal/cuda_kernels.h"

namespace fsdp2 {
namespace kernels {
namespace cuda {
namespace {

// M_SQRT2, M_2_SQRTPI and M_SQRT1_2, as ATen combines them in double.
constexpr double kSqrt2 = 1.41421356237309504880;
constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
constexpr double kSqrtHalf = 0.70710678118654752440;

__device__ __forceinline__ float GeluGrad(float dy, float x, bool tanh_approximation) {
  if (tanh_approximation) {
    constexpr float kBeta = float(kSqrt2 * kTwoOverSqrtPi * 0.5);
    constexpr float kKappa = 0.044715f;
    const float x_sq = x * x;
    const float x_cube = x_sq * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    const float tanh_inner = tanhf(inner);
    const float left = 0.5f * x;
    const float right = 1.f + tanh_inner;
    const float left_derivative = 0.5f * right;
    const float tanh_derivative = 1.f - tanh_inner * tanh_inner;
    const float inner_derivative = kBeta * (1.f + 3.f * kKappa * x_sq);
    const float right_derivative = left * tanh_derivative * inner_derivative;
    return dy * (left_derivative + right_derivative);
  }
  constexpr float kBeta = float(kTwoOverSqrtPi * kSqrtHalf * 0.5);
  const float cdf = 0.5f * (1.f + erff(x * float(kSqrtHalf)));
  const float pdf = expf(-0.5f * x * x) * kBeta;
  return dy * (cdf + x * pdf);
}

// Blocks of 32 x 8 threads over columns [32 bx, 32 bx + 32) and the rows of
// part by (r % parts == by), as NormParamGradKernel in common.cuh.
template <typename T>
__global__ void GeluBackwardKernel(const T* __restrict__ dy, const T* __restrict__ z,
                                   bool tanh_approximation, int64_t rows, int64_t cols,
                                   T* __restrict__ dz, float* __restrict__ bias_part) {
  __shared__ float bias_sum[8][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t parts = gridDim.y;
  float b = 0.f;
  if (c < cols) {
    for (int64_t r = int64_t(blockIdx.y) + parts * threadIdx.y; r < rows; r += parts * 8) {
      const int64_t i = r * cols + c;
      const T g = FromFloat<T>(GeluGrad(ToFloat(dy[i]), ToFloat(z[i]), tanh_approximation));
      dz[i] = g;
      b += ToFloat(g);
    }
  }
  if (bias_part == nullptr) return;  // the same for the whole grid
  bias_sum[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int i = 1; i < 8; ++i) b += bias_sum[i][threadIdx.x];
    bias_part[int64_t(blockIdx.y) * cols + c] = b;
  }
}

template <typename T>
cudaError_t Backward(bool tanh_approximation, const void* dy, const void* z, int64_t rows,
                     int64_t cols, int64_t parts, void* dz, float* bias_part,
                     cudaStream_t stream) {
  const dim3 grid(Blocks(cols, 32), static_cast<unsigned>(parts));
  GeluBackwardKernel<T><<<grid, dim3(32, 8), 0, stream>>>(
      static_cast<const T*>(dy), static_cast<const T*>(z), tanh_approximation, rows, cols,
      static_cast<T*>(dz), bias_part);
  return cudaGetLastError();
}

}  // namespace

cudaError_t GeluBackward(ElementType type, bool tanh, const void* dy, const void* z,
                         int64_t rows, int64_t cols, int64_t parts, void* dz, float* bias_part,
                         cudaStream_t stream) {
  return type == ElementType::kBFloat16
             ? Backward<__nv_bfloat16>(tanh, dy, z, rows, cols, parts, dz, bias_part, stream)
             : Backward<float>(tanh, dy, z, rows, cols, parts, dz, bias_part, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace fsdp2
