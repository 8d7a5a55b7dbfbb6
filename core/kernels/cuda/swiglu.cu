// fsdp2/core/kernels/cuda/swiglu.cu
//
// SwiGLU, silu(gate) * up, forward and backward in one elementwise pass
// each (the CUDA side of core/kernels/swiglu.cc). It rounds where the
// composite stores in the activations' dtype (silu(gate), dy * up), so that
// in bfloat16 it gives the composite's values; silu and its derivative are
// computed as ATen's CUDA kernels compute them.
#include "core/kernels/cuda/common.cuh"
#include "core/kernels/internal/cuda_kernels.h"

namespace fsdp2 {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void SwigluForwardKernel(const T* __restrict__ gate, const T* __restrict__ up,
                                    int64_t n, T* __restrict__ y) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    const float g = ToFloat(gate[i]);
    const float act = Round<T>(g / (1.f + expf(-g)));
    y[i] = FromFloat<T>(act * ToFloat(up[i]));
  }
}

// d(up) = dy * silu(gate); d(gate) = silu'(gate) * (dy * up), with
// silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g))).
template <typename T>
__global__ void SwigluBackwardKernel(const T* __restrict__ dy, const T* __restrict__ gate,
                                     const T* __restrict__ up, int64_t n, T* __restrict__ dgate,
                                     T* __restrict__ dup) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    const float g = ToFloat(gate[i]);
    const float d = ToFloat(dy[i]);
    const float act = Round<T>(g / (1.f + expf(-g)));
    const float d_act = Round<T>(d * ToFloat(up[i]));
    const float sigmoid = 1.f / (1.f + expf(-g));
    dgate[i] = FromFloat<T>(d_act * sigmoid * (1.f + g * (1.f - sigmoid)));
    dup[i] = FromFloat<T>(d * act);
  }
}

// Enough blocks to fill the card several times over; the loops stride.
unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

template <typename T>
cudaError_t Forward(const void* gate, const void* up, int64_t n, void* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SwigluForwardKernel<T><<<GridFor(n), kThreads, 0, stream>>>(
      static_cast<const T*>(gate), static_cast<const T*>(up), n, static_cast<T*>(y));
  return cudaGetLastError();
}

template <typename T>
cudaError_t Backward(const void* dy, const void* gate, const void* up, int64_t n, void* dgate,
                     void* dup, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SwigluBackwardKernel<T><<<GridFor(n), kThreads, 0, stream>>>(
      static_cast<const T*>(dy), static_cast<const T*>(gate), static_cast<const T*>(up), n,
      static_cast<T*>(dgate), static_cast<T*>(dup));
  return cudaGetLastError();
}

}  // namespace

cudaError_t SwigluForward(ElementType type, const void* gate, const void* up, int64_t n,
                          void* y, cudaStream_t stream) {
  return type == ElementType::kBFloat16 ? Forward<__nv_bfloat16>(gate, up, n, y, stream)
                                        : Forward<float>(gate, up, n, y, stream);
}

cudaError_t SwigluBackward(ElementType type, const void* dy, const void* gate, const void* up,
                           int64_t n, void* dgate, void* dup, cudaStream_t stream) {
  return type == ElementType::kBFloat16
             ? Backward<__nv_bfloat16>(dy, gate, up, n, dgate, dup, stream)
             : Backward<float>(dy, gate, up, n, dgate, dup, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace fsdp2
