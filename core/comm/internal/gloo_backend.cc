// The one file of fsdp2 that includes ProcessGroupGloo.hpp (see
// gloo_backend.h). Every call below is an out-of-line function of
// libtorch_cpu.so; gloo objects are only held and copied as shared pointers.
#include "core/comm/internal/gloo_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace fsdp2 {
namespace comm {
namespace internal {

struct GlooDevice {
  std::shared_ptr<::gloo::transport::Device> device;
};

std::shared_ptr<GlooDevice> GlooDeviceForInterface(const std::string& ifname) {
  return std::make_shared<GlooDevice>(
      GlooDevice{::c10d::ProcessGroupGloo::createDeviceForInterface(ifname)});
}

std::shared_ptr<GlooDevice> GlooDeviceForAddress(const std::string& address) {
  return std::make_shared<GlooDevice>(
      GlooDevice{::c10d::ProcessGroupGloo::createDeviceForHostname(address)});
}

c10::intrusive_ptr<::c10d::Backend> ConnectGlooBackend(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int world,
    const std::shared_ptr<GlooDevice>& device, std::chrono::milliseconds timeout) {
  auto options = c10::make_intrusive<::c10d::ProcessGroupGloo::Options>(timeout);
  options->devices.push_back(device->device);
  options->threads = 1;
  return c10::make_intrusive<::c10d::ProcessGroupGloo>(store, rank, world, options);
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
