#include "core/kernels/dispatch.h"

#include <cstdlib>
#include <cstring>

namespace fsdp2 {
namespace kernels {

bool CudaKernelsBuilt() {
#ifdef FSDP2_KERNELS_CUDA
  return true;
#else
  return false;
#endif
}

bool CudaKernelsEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("FSDP2_CUDA_KERNELS");
    return v == nullptr || (std::strcmp(v, "off") != 0 && std::strcmp(v, "0") != 0);
  }();
  return CudaKernelsBuilt() && enabled;
}

bool RunsCudaKernel(const at::Tensor& t) {
  return CudaKernelsEnabled() && t.defined() && t.is_cuda() &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

}  // namespace kernels
}  // namespace fsdp2
