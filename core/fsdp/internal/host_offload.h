// fsdp2/core/fsdp/internal/host_offload.h
//
// The device-generic pieces of CPU offload (OffloadPolicy): host buffers,
// the copy stream and the waits between streams. On the CPU there are no
// streams: every wait is a no-op and every copy is done when it returns.
//
// Internal to core/fsdp.
#ifndef FSDP2_CORE_FSDP_INTERNAL_HOST_OFFLOAD_H_
#define FSDP2_CORE_FSDP_INTERNAL_HOST_OFFLOAD_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <memory>

namespace c10 {
struct Event;
}  // namespace c10

namespace fsdp2 {
namespace fsdp {
namespace internal {

// An uninitialised host tensor of `sizes` with `options`' dtype; in
// page-locked memory when `options` asks for it and it can be had, else
// pageable.
at::Tensor EmptyHost(at::IntArrayRef sizes, const at::TensorOptions& options);

// The stream work is queued on now for `device` (the thread's current one).
c10::Stream CurrentStream(const at::Device& device);
// The stream offload copies `device`'s tensors on: one per device and
// process, from the device's pool, so that copies overlap compute.
c10::Stream CopyStream(const at::Device& device);
// Work queued on `waiter` from now on starts after the work queued on
// `before` so far. No-op on the CPU or when they are one stream.
void WaitFor(const c10::Stream& waiter, const c10::Stream& before);
// An event recorded on `stream` now (null on the CPU).
std::unique_ptr<c10::Event> RecordOn(const c10::Stream& stream);
// Work queued on `stream` from now on starts after `event` (null: no-op).
void Block(const c10::Stream& stream, const c10::Event* event);
// Tells the device's caching allocator that `stream` reads `t`'s memory, so
// that it is not handed out again before that stream's queued work is done.
void RecordStream(const at::Tensor& t, const c10::Stream& stream);

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_HOST_OFFLOAD_H_
