#include "core/fsdp/internal/host_offload.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <map>
#include <mutex>

namespace fsdp2 {
namespace fsdp {
namespace internal {

at::Tensor EmptyHost(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const at::TensorOptions host = options.device(at::kCPU);
  if (host.pinned_memory()) {
    try {
      return at::empty(sizes, host);
    } catch (const c10::Error&) {
      // No page-locked memory to be had: pageable, whose copies are
      // finished when they return.
    }
  }
  return at::empty(sizes, host.pinned_memory(false));
}

c10::Stream CurrentStream(const at::Device& device) {
  if (device.is_cpu()) return c10::Stream(c10::Stream::DEFAULT, device);
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

c10::Stream CopyStream(const at::Device& device) {
  if (device.is_cpu()) return c10::Stream(c10::Stream::DEFAULT, device);
  static std::mutex mu;
  static std::map<std::pair<int, int>, c10::Stream> streams;
  std::lock_guard<std::mutex> lock(mu);
  const std::pair<int, int> key{static_cast<int>(device.type()), device.index()};
  auto found = streams.find(key);
  if (found == streams.end()) {
    found = streams
                .emplace(key, c10::impl::VirtualGuardImpl(device.type())
                                  .getStreamFromGlobalPool(device, /*isHighPriority=*/false))
                .first;
  }
  return found->second;
}

std::unique_ptr<c10::Event> RecordOn(const c10::Stream& stream) {
  if (stream.device().is_cpu()) return nullptr;
  auto event = std::make_unique<c10::Event>(stream.device_type());
  event->record(stream);
  return event;
}

void Block(const c10::Stream& stream, const c10::Event* event) {
  if (event != nullptr && !stream.device().is_cpu()) event->block(stream);
}

void WaitFor(const c10::Stream& waiter, const c10::Stream& before) {
  if (waiter.device().is_cpu() || waiter == before) return;
  const std::unique_ptr<c10::Event> queued = RecordOn(before);
  Block(waiter, queued.get());
}

void RecordStream(const at::Tensor& t, const c10::Stream& stream) {
  if (!t.defined() || t.device().is_cpu()) return;
  c10::impl::VirtualGuardImpl(stream.device_type())
      .recordDataPtrOnStream(t.storage().data_ptr(), stream);
}

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2
