// fsdp2/core/comm/internal/host.h
//
// Which host a rank runs on, and which of its addresses reaches another.
// Internal to core/comm.
#ifndef FSDP2_CORE_COMM_INTERNAL_HOST_H_
#define FSDP2_CORE_COMM_INTERNAL_HOST_H_

#include <string>

namespace fsdp2 {
namespace comm {
namespace internal {

// This host, as precisely as processes sharing /dev/shm need: the host name
// and the kernel's boot id ("name/boot-id"). Two network namespaces with
// their own UTS name on one machine count as two hosts.
std::string HostIdentity();

// The host part of HostIdentity(): the name alone, for messages.
std::string HostName(const std::string& identity);

// The local address and the interface through which this host's routing
// table reaches `address` (a name or a numeric IPv4/IPv6 address), found as
// NCCL finds its socket interface: a UDP socket connected to the address
// (nothing is sent) reports the source address the kernel chose.
struct Route {
  std::string local_address;  // numeric, e.g. "10.231.7.2"
  std::string interface;      // e.g. "eth0"; empty if no interface has it
};
// Throws fsdp2::CommunicationError naming GLOO_SOCKET_IFNAME when the
// address does not resolve or no route reaches it.
Route RouteTo(const std::string& address);

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_HOST_H_
