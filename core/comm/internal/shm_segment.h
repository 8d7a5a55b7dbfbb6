// fsdp2/core/comm/internal/shm_segment.h
//
// ShmSegment: one shared-memory segment mapped by every rank of a group on
// this host, and the barrier that orders their use of it. ShmTransport
// moves collectives through it.
//
// The segment holds a header (two cache lines per rank with its sequence
// word, pid and the signatures of its last syncs) and one slot of `slot_bytes` per rank. sync() is a barrier
// over the sequence words: it spins briefly and then sleeps on a futex, so
// ranks that outnumber the cores do not burn them. A rank that does not
// arrive within the timeout, or whose process has exited, makes the waiting
// ranks throw CommunicationError (TimeoutError) naming it.
//
// Every sync() names the collective it belongs to (CollectiveSignature):
// after the barrier each rank compares every rank's signature for it, so
// ranks that are in different collectives (a different kind, dtype or size:
// ranks that issued different collectives, or the same ones in another
// order) throw CommunicationError naming both, before any rank reads
// another's slot, instead of mixing their buffers.
//
// Calls must come from one thread at a time, and every rank must sync the
// same number of times. Internal to core/comm.
#ifndef FSDP2_CORE_COMM_INTERNAL_SHM_SEGMENT_H_
#define FSDP2_CORE_COMM_INTERNAL_SHM_SEGMENT_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/comm/internal/c10d.h"

namespace fsdp2 {
namespace comm {
namespace internal {

// What a sync() is part of. Ranks that sync together must agree on it.
struct CollectiveSignature {
  enum Kind : uint32_t {
    kBarrier = 0,
    kAllGather,
    kReduceScatter,
    kAllReduceSum,
    kAllReduceMax,
    kBroadcast,
  };
  Kind kind = kBarrier;
  int32_t dtype = -1;  // at::ScalarType, -1: none
  int64_t numel = 0;   // elements per rank
  int64_t extra = 0;   // the broadcast root
  bool operator==(const CollectiveSignature& o) const {
    return kind == o.kind && dtype == o.dtype && numel == o.numel &&
           extra == o.extra;
  }
  std::string ToString() const;
};

class ShmSegment {
 public:
  // Collective over the `world` ranks sharing `store` (prefixed for this
  // group and lane), all on this host: rank 0 creates the segment and every
  // rank maps it. Returns null, on every rank alike, if any rank could not
  // create or map it (the ranks then use another transport). The segment's
  // name is unlinked once all have mapped it, so nothing outlives the ranks.
  static std::unique_ptr<ShmSegment> Create(::c10d::Store& store, int rank,
                                            int world, size_t slot_bytes,
                                            std::chrono::milliseconds timeout);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  size_t slot_bytes() const { return slot_bytes_; }

  // A CPU tensor of `options`' dtype over `numel` elements of `rank`'s slot,
  // from element `offset`. It aliases the segment: valid while it lives.
  at::Tensor slot(int rank, int64_t offset, int64_t numel,
                  const at::TensorOptions& options) const;

  // Barrier: returns once every rank has called sync() as often as this
  // one. Writes to the slots before it are visible to all ranks after it.
  // Throws CommunicationError if another rank's `signature` differs.
  void sync(const CollectiveSignature& signature = CollectiveSignature());

 private:
  ShmSegment(int rank, int world, size_t slot_bytes, void* base,
             size_t mapped_bytes, std::chrono::milliseconds timeout);

  int rank_;
  int world_;
  size_t slot_bytes_;
  void* base_;
  size_t mapped_bytes_;
  std::chrono::milliseconds timeout_;
  uint32_t epoch_ = 0;
};

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_SHM_SEGMENT_H_
