// fsdp2/core/kernels/cuda/rotary.cu
//
// Rotary position embeddings, forward and backward, in one elementwise pass
// (the CUDA side of core/kernels/rotary.cc): one thread a pair (i, i + half)
// of one head's position. Input and output may be strided views (the
// [batch, heads, seq, dim] transpose of a projection's output) with unit
// stride in dim. Each product is rounded before the sum, as the composite
// x * cos + rotate_half(x) * sin stores them.
#include "core/kernels/cuda/common.cuh"
#include "core/kernels/internal/cuda_kernels.h"

namespace fsdp2 {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void RotaryKernel(bool backward, const T* __restrict__ in, const T* __restrict__ cos,
                             const T* __restrict__ sin, RotaryLayout layout,
                             T* __restrict__ out) {
  const int64_t half = layout.dim / 2;
  const int64_t n = layout.batch * layout.heads * layout.seq * half;
  for (int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * kThreads) {
    const int64_t i = k % half;
    const int64_t t = (k / half) % layout.seq;
    const int64_t h = (k / half / layout.seq) % layout.heads;
    const int64_t b = k / half / layout.seq / layout.heads;
    const T* src = in + b * layout.in_stride[0] + h * layout.in_stride[1] + t * layout.in_stride[2];
    T* dst = out + b * layout.out_stride[0] + h * layout.out_stride[1] + t * layout.out_stride[2];
    const int64_t lo = t * layout.dim + i, hi = lo + half;
    const float x_lo = ToFloat(src[i]), x_hi = ToFloat(src[i + half]);
    const float c_lo = ToFloat(cos[lo]), c_hi = ToFloat(cos[hi]);
    const float s_lo = ToFloat(sin[lo]), s_hi = ToFloat(sin[hi]);
    if (!backward) {
      dst[i] = FromFloat<T>(Round<T>(x_lo * c_lo) + Round<T>(-x_hi * s_lo));
      dst[i + half] = FromFloat<T>(Round<T>(x_hi * c_hi) + Round<T>(x_lo * s_hi));
    } else {
      dst[i] = FromFloat<T>(Round<T>(x_lo * c_lo) + Round<T>(x_hi * s_hi));
      dst[i + half] = FromFloat<T>(Round<T>(x_hi * c_hi) - Round<T>(x_lo * s_lo));
    }
  }
}

template <typename T>
cudaError_t Launch(bool backward, const void* in, const void* cos, const void* sin,
                   const RotaryLayout& layout, void* out, cudaStream_t stream) {
  const int64_t n = layout.batch * layout.heads * layout.seq * (layout.dim / 2);
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  RotaryKernel<T><<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(
      backward, static_cast<const T*>(in), static_cast<const T*>(cos),
      static_cast<const T*>(sin), layout, static_cast<T*>(out));
  return cudaGetLastError();
}

}  // namespace

cudaError_t Rotary(ElementType type, bool backward, const void* in, const void* cos,
                   const void* sin, const RotaryLayout& layout, void* out, cudaStream_t stream) {
  return type == ElementType::kBFloat16
             ? Launch<__nv_bfloat16>(backward, in, cos, sin, layout, out, stream)
             : Launch<float>(backward, in, cos, sin, layout, out, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace fsdp2
