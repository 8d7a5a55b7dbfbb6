// fsdp2/core/comm/collective_types.h
//
// The vocabulary of the collectives: reduction operators, reduce-scatter
// algorithms and the pieces of a piecewise all-gather. Shared by
// ProcessGroup (process_group.h, the API) and the transports that carry its
// collectives (internal/transport.h); include process_group.h instead.
#ifndef FSDP2_CORE_COMM_COLLECTIVE_TYPES_H_
#define FSDP2_CORE_COMM_COLLECTIVE_TYPES_H_

#include <cstdint>

namespace fsdp2 {
namespace comm {

enum class ReduceOp { kSum, kMax };

// How reduce_scatter is carried out where the backend has no native one.
enum class ReduceScatterAlgorithm {
  kAuto,       // the backend's own if it has one, else kRing
  kRing,       // ring of send/recv: each rank sends (W-1)/W of the input
  kAllReduce,  // all-reduce the whole input, keep this rank's slice
};

// One rank's part of a piece of a parameter-major buffer (see
// ProcessGroup::all_gather_pieces).
struct Piece {
  int64_t offset = 0;  // elements, in the per-rank layout
  int64_t numel = 0;   // elements each rank contributes
};

}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_COLLECTIVE_TYPES_H_
