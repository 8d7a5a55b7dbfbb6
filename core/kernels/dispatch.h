// fsdp2/core/kernels/dispatch.h
//
// How the entry points of core/kernels choose between their CUDA kernel and
// their ATen composite. A caller never has to ask: every entry point gives
// the same function on every device. These are for tests, benchmarks and
// logs that want to say which one ran.
#ifndef FSDP2_CORE_KERNELS_DISPATCH_H_
#define FSDP2_CORE_KERNELS_DISPATCH_H_

#include <ATen/core/Tensor.h>

namespace fsdp2 {
namespace kernels {

// Whether this build carries the CUDA kernels: it was built with the CUDA
// toolkit's nvcc against a LibTorch with CUDA (see core/kernels/BUILD).
bool CudaKernelsBuilt();

// Whether the built kernels may run: false where they are not built, or
// where the environment says FSDP2_CUDA_KERNELS=off (or 0), read once per
// process: every entry point then takes its ATen composite, to compare the
// two on a GPU or to rule the kernels out.
bool CudaKernelsEnabled();

// Whether an entry point given `t` as its main input runs its CUDA kernel:
// the kernels are enabled, `t` is on a CUDA device and is float32 or
// bfloat16. Otherwise (the CPU, float64, float16, a build without them) it
// runs its ATen composite. An entry point may still take its composite for
// a shape its kernel does not cover; its header says when.
bool RunsCudaKernel(const at::Tensor& t);

}  // namespace kernels
}  // namespace fsdp2

#endif  // FSDP2_CORE_KERNELS_DISPATCH_H_
