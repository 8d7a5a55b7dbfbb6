// fsdp2/core/comm/internal/process_group_impl.h
//
// The state behind ProcessGroup, shared with World, which builds groups.
#ifndef FSDP2_CORE_COMM_INTERNAL_PROCESS_GROUP_IMPL_H_
#define FSDP2_CORE_COMM_INTERNAL_PROCESS_GROUP_IMPL_H_

#include <c10/core/Stream.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/comm/comm_handle.h"
#include "core/comm/internal/peer_check.h"
#include "core/comm/internal/transport.h"
#include "core/comm/process_group.h"

namespace fsdp2 {
namespace comm {

struct ProcessGroup::Impl {
  std::string name;
  std::vector<int> global_ranks;
  int rank = 0;
  int world_rank = 0;
  std::string backend;  // "gloo" or "nccl", as the world was created
  std::chrono::milliseconds timeout{0};
  // Per lane: how its collectives travel, chosen once when the group was
  // created (internal/connect_transport.h), and the worker that runs them
  // in issue order. The workers stop before the transports go.
  std::array<std::unique_ptr<internal::Transport>, kNumLanes> transports;
  std::array<std::unique_ptr<CommLane>, kNumLanes> lanes;
  // Held while a collective takes its ticket and is queued on its lane, so
  // that ticket order and each lane's queue order agree even if two
  // threads issue at once (the order across ranks then still needs one
  // program order; see internal/issue_order.h).
  std::mutex issue_mu;
  // Per lane, the device stream its collectives on device tensors run on
  // (taken from the device's pool when first needed; one device per
  // process).
  std::mutex streams_mu;
  std::array<std::optional<c10::Stream>, kNumLanes> streams;
  std::atomic<int64_t> bytes_sent{0};
  // Names the lost peers when a collective fails (nullptr-store: not
  // checked, as for groups of one rank).
  internal::PeerCheck peer_check;
};

}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_PROCESS_GROUP_IMPL_H_
