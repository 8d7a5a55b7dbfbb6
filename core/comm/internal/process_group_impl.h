// fsdp2/core/comm/internal/process_group_impl.h
//
// The state behind ProcessGroup, shared with World, which builds groups.
#ifndef FSDP2_CORE_COMM_INTERNAL_PROCESS_GROUP_IMPL_H_
#define FSDP2_CORE_COMM_INTERNAL_PROCESS_GROUP_IMPL_H_

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/comm_handle.h"
#include "core/comm/internal/c10d_compat.h"
#include "core/comm/internal/shm_transport.h"
#include "core/comm/process_group.h"

namespace fsdp2 {
namespace comm {

struct ProcessGroup::Impl {
  std::string name;
  std::vector<int> global_ranks;
  int rank = 0;
  int world_rank = 0;
  std::chrono::milliseconds timeout{0};
  // One communicator and one worker per lane.
  std::array<c10::intrusive_ptr<internal::C10dBackend>, kNumLanes> backends;
  std::array<std::unique_ptr<CommLane>, kNumLanes> lanes;
  // Per lane, when every rank of the group is on this host: collectives of
  // CPU tensors go through shared memory instead of the backend.
  std::array<std::unique_ptr<internal::ShmTransport>, kNumLanes> shm;
  std::atomic<int64_t> bytes_sent{0};
  // Receive buffer of ring reduce-scatter, kept per lane: allocating tens of
  // MiB afresh each call costs page faults (glibc maps such blocks anew).
  std::array<at::Tensor, kNumLanes> ring_scratch;
};

}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_PROCESS_GROUP_IMPL_H_
