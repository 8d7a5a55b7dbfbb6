#include "core/comm/internal/host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "core/common/error.h"

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

std::string Numeric(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST] = {0};
  if (getnameinfo(addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

bool SameAddress(const sockaddr* a, const sockaddr* b) {
  if (a == nullptr || b == nullptr || a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr,
                       sizeof(in6_addr)) == 0;
  }
  return false;
}

[[noreturn]] void NoRoute(const std::string& address, const std::string& why) {
  throw CommunicationError(
      "cannot find the network interface that reaches MASTER_ADDR=" +
      address + " (" + why +
      "); set GLOO_SOCKET_IFNAME to the interface the ranks reach each other "
      "through (see `ip addr`), or MASTER_ADDR to an address of rank 0's host");
}

}  // namespace

std::string HostIdentity() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return std::string(host) + "/" + boot;
}

std::string HostName(const std::string& identity) {
  return identity.substr(0, identity.find('/'));
}

Route RouteTo(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(address.c_str(), "9", &hints, &found);
  if (rc != 0 || found == nullptr) NoRoute(address, gai_strerror(rc));
  std::string last_error = "no address";
  Route route;
  for (addrinfo* ai = found; ai != nullptr && route.local_address.empty();
       ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    close(fd);
    route.local_address = Numeric(reinterpret_cast<sockaddr*>(&local), len);
    ifaddrs* ifs = nullptr;
    if (getifaddrs(&ifs) == 0) {
      for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
        if (SameAddress(i->ifa_addr, reinterpret_cast<sockaddr*>(&local))) {
          route.interface = i->ifa_name;
          break;
        }
      }
      freeifaddrs(ifs);
    }
  }
  freeaddrinfo(found);
  if (route.local_address.empty()) NoRoute(address, last_error);
  return route;
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
