// fsdp2/core/comm/internal/connect_transport.h
//
// ConnectTransport: the one place that decides how a process group's lane
// moves its bytes (transport.h), once, when the group is created:
//   - a group of one rank: SingleRankTransport, no communicator;
//   - backend "nccl": NcclTransport (builds with USE_C10D_NCCL only), one
//     communicator for the group, shared by its lanes (ConnectLanes);
//     CPU tensors staged through the GPU (StagedTransport::ThroughDevice);
//   - backend "gloo", every rank of the group on this host and none with
//     FSDP2_SHM=0 in its environment: ShmTransport, with a GlooTransport
//     beneath it for what shared memory does not carry;
//   - otherwise GlooTransport.
// Both gloo transports have device tensors staged through host memory
// (StagedTransport::ThroughHost).
// The ranks agree through the group's store, so all of them choose alike
// (also when creating the shared-memory segment fails on any of them).
// Internal to core/comm.
#ifndef FSDP2_CORE_COMM_INTERNAL_CONNECT_TRANSPORT_H_
#define FSDP2_CORE_COMM_INTERNAL_CONNECT_TRANSPORT_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/internal/c10d.h"
#include "core/comm/backend.h"
#include "core/comm/internal/gloo_backend.h"
#include "core/comm/internal/transport.h"

namespace fsdp2 {
namespace comm {
namespace internal {

// Per rank and lane of a group on one host; shared-memory collectives move
// their data through it in segments of this size.
constexpr size_t kShmSlotBytes = size_t{2} << 20;

struct TransportOptions {
  // The group's store, prefixed for this group (ConnectLanes) or for this
  // group and lane (ConnectTransport).
  c10::intrusive_ptr<::c10d::Store> store;
  int rank = 0;   // this rank within the group
  int world = 1;  // ranks in the group
  Backend backend = Backend::kGloo;
  // Where Gloo's communicators connect; required for backend "gloo".
  std::shared_ptr<GlooDevice> gloo_device;
  // Every collective of the transport fails after this long.
  std::chrono::milliseconds timeout{0};
};

// Collective over the group's ranks: each calls it with its own rank and
// otherwise the same options. Throws if a communicator cannot be created
// or this build lacks the backend (RequireBuilt).
std::unique_ptr<Transport> ConnectTransport(const TransportOptions& options);

// The transports of a group's `lanes` lanes, lane k's connected through
// the store prefixed with "k/" (its own communicator), except for NCCL,
// whose lanes share one communicator and its issue order. Collective as
// ConnectTransport.
std::vector<std::unique_ptr<Transport>> ConnectLanes(const TransportOptions& options,
                                                     int lanes);

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_CONNECT_TRANSPORT_H_
