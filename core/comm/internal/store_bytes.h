// fsdp2/core/comm/internal/store_bytes.h
//
// c10d's Store keeps its values as bytes; the rendezvous, the host
// exchange, the peer checks and the transports' handshakes write and read
// strings. These convert between the two, byte for byte. Internal to
// core/comm.
#ifndef FSDP2_CORE_COMM_INTERNAL_STORE_BYTES_H_
#define FSDP2_CORE_COMM_INTERNAL_STORE_BYTES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp2 {
namespace comm {
namespace internal {

// `s` as a store value.
inline std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

// A store value as a string.
inline std::string String(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_STORE_BYTES_H_
