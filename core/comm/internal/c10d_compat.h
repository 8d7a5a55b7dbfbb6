// fsdp2/core/comm/internal/c10d_compat.h
//
// The one place that knows how the c10d C++ API differs between LibTorch 1.13
// (Debian) and LibTorch 2.x (pip wheels, CUDA builds). In 1.13 the concrete
// process groups derive from c10d::ProcessGroup; in 2.x they derive from
// c10d::Backend. Both expose the same collective methods we call.
#ifndef FSDP2_CORE_COMM_INTERNAL_C10D_COMPAT_H_
#define FSDP2_CORE_COMM_INTERNAL_C10D_COMPAT_H_

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace fsdp2 {
namespace comm {
namespace internal {

#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = ::c10d::Backend;
#else
using C10dBackend = ::c10d::ProcessGroup;
#endif

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_C10D_COMPAT_H_
