// fsdp2/core/kernels/internal/cuda_launch.h
//
// What the entry points (core/kernels/*.cc) need to launch a kernel of
// cuda_kernels.h on a tensor's device: its element type, the device's
// current stream, the check of a launch's result, and how many parts the
// column sums of a backward take. Only for builds with the CUDA kernels
// (FSDP2_KERNELS_CUDA); include it inside #ifdef FSDP2_KERNELS_CUDA.
#ifndef FSDP2_CORE_KERNELS_INTERNAL_CUDA_LAUNCH_H_
#define FSDP2_CORE_KERNELS_INTERNAL_CUDA_LAUNCH_H_

#ifndef FSDP2_KERNELS_CUDA
#error "cuda_launch.h is for builds with the CUDA kernels (FSDP2_KERNELS_CUDA)"
#endif

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "core/kernels/internal/cuda_kernels.h"

namespace fsdp2 {
namespace kernels {
namespace internal {

// float32 or bfloat16 (RunsCudaKernel admits no other).
inline cuda::ElementType ElementTypeOf(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? cuda::ElementType::kBFloat16
                                          : cuda::ElementType::kFloat32;
}

// The current stream of `t`'s device, where ATen's own kernels on it run.
inline cudaStream_t StreamOf(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// Parts of a column sum over `rows` rows (NormParamGradKernel): about 64
// rows a part, at most 128 parts.
inline int64_t ColumnSumParts(int64_t rows) {
  return std::min<int64_t>(128, std::max<int64_t>(1, rows / 64));
}

}  // namespace internal
}  // namespace kernels
}  // namespace fsdp2

// Throws c10::Error with CUDA's message when a launch failed.
#define FSDP2_KERNEL_CHECK(call) C10_CUDA_CHECK(call)

#endif  // FSDP2_CORE_KERNELS_INTERNAL_CUDA_LAUNCH_H_
