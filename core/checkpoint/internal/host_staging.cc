#include "core/checkpoint/internal/host_staging.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace fsdp2 {
namespace checkpoint {
namespace internal {

at::Tensor HostStaging::Stage(const at::Tensor& t, bool live) {
  const at::Tensor source = t.detach();
  if (source.is_cpu()) return live ? source.clone(at::MemoryFormat::Contiguous) : source;
  at::Tensor host;
  try {
    host = at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(true));
  } catch (const c10::Error&) {
    // No pinned memory to be had: an ordinary copy, finished when it returns.
    return source.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true,
                     at::MemoryFormat::Contiguous);
  }
  host.copy_(source, /*non_blocking=*/true);
  device_ = source.device();
  return host;
}

void HostStaging::Done() {
  if (!device_) return;
  const c10::impl::VirtualGuardImpl guard(device_->type());
  copied_ = std::make_shared<c10::Event>(device_->type());
  copied_->record(guard.getStream(*device_));
}

void HostStaging::Wait() const {
  if (copied_) copied_->synchronize();
}

}  // namespace internal
}  // namespace checkpoint
}  // namespace fsdp2
