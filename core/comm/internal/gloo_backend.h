// fsdp2/core/comm/internal/gloo_backend.h
//
// c10d's Gloo backend, created without its header. PyTorch's wheel installs
// no gloo headers, but ProcessGroupGloo.hpp includes them; Debian's
// libgloo-dev supplies their declarations, from another gloo version than
// the one inside libtorch_cpu.so. That is safe only while our code never
// uses a gloo definition (a class layout or an inline gloo function), so
// gloo_backend.cc is the one file that includes ProcessGroupGloo.hpp, it
// holds gloo objects only through pointers that libtorch made, and
// //core/comm:gloo_headers_test checks its object code for any use of gloo.
// Everything else sees an opaque GlooDevice.
#ifndef FSDP2_CORE_COMM_INTERNAL_GLOO_BACKEND_H_
#define FSDP2_CORE_COMM_INTERNAL_GLOO_BACKEND_H_

#include <chrono>
#include <memory>
#include <string>

#include "core/comm/internal/c10d.h"

namespace fsdp2 {
namespace comm {
namespace internal {

// Where a rank's Gloo communicators listen and connect: one network
// interface or address. Made by libtorch; shared by every group of a rank.
struct GlooDevice;

// The device on network interface `ifname` (GLOO_SOCKET_IFNAME). Throws
// c10::Error if there is no such interface.
std::shared_ptr<GlooDevice> GlooDeviceForInterface(const std::string& ifname);

// The device bound to `address` (a host name or an IP address of this host).
std::shared_ptr<GlooDevice> GlooDeviceForAddress(const std::string& address);

// Collective over the `world` ranks sharing `store`: their Gloo backend on
// `device`, with one worker thread and every operation failing after
// `timeout`.
c10::intrusive_ptr<::c10d::Backend> ConnectGlooBackend(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int world,
    const std::shared_ptr<GlooDevice>& device, std::chrono::milliseconds timeout);

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_GLOO_BACKEND_H_
