#include "core/kernels/dispatch.h"

namespace fsdp2 {
namespace kernels {

bool CudaKernelsBuilt() {
#ifdef FSDP2_KERNELS_CUDA
  return true;
#else
  return false;
#endif
}

bool RunsCudaKernel(const at::Tensor& t) {
  return CudaKernelsBuilt() && t.defined() && t.is_cuda() &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

}  // namespace kernels
}  // namespace fsdp2
