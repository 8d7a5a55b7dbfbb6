// fsdp2/core/comm/internal/transport.h
//
// Transport: how one process group's lane moves its bytes. One virtual per
// collective the engine needs, one class per way of carrying them, as
// c10d's Backend has one class per backend:
//   SingleRankTransport  a group of one rank: copies, no communication
//   ShmTransport         shared memory between the ranks of one host
//   GlooTransport        c10d's Gloo, with rings of send/recv where LibTorch
//                        1.13's Gloo has no flat all-gather or reduce-scatter
//   NcclTransport        c10d's NCCL and its native flat collectives
//                        (builds with USE_C10D_NCCL only)
// Which one a lane gets is decided once, when the group is created, by
// ConnectTransport (connect_transport.h); ProcessGroup checks the
// arguments, counts the bytes and runs the transport's collective on the
// lane's worker, never asking which transport it has.
//
// Contract of every transport: each call is a collective that every rank
// of the group makes in the same order, from one thread at a time (the
// lane's worker); it returns when this rank's output is complete and its
// inputs may be reused. Tensors are contiguous, of any shape, taken element
// by element; the arguments have been checked by ProcessGroup (sizes,
// dtypes, pieces within the buffer). Failures, a peer that does not answer
// within the timeout included, are thrown as exceptions (std::runtime_error
// or c10::Error); ProcessGroup adds the rank, collective and group to the
// message. Internal to core/comm.
#ifndef FSDP2_CORE_COMM_INTERNAL_TRANSPORT_H_
#define FSDP2_CORE_COMM_INTERNAL_TRANSPORT_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "core/comm/collective_types.h"
#include "core/comm/internal/issue_order.h"

namespace fsdp2 {
namespace comm {
namespace internal {

class Transport {
 public:
  // This rank is `rank` of a group of `world` ranks.
  Transport(int rank, int world) : rank_(rank), world_(world) {}
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  // "shm", "gloo", "nccl" or "single" (a group of one rank), for the byte
  // counts of comm::BytesSentByTransport().
  virtual const char* kind() const = 0;

  // The semantics of the ProcessGroup collectives of the same names.
  // output (world() * n elements) receives every rank's input (n elements)
  // in rank order.
  virtual void all_gather_into_flat(const at::Tensor& output,
                                    const at::Tensor& input) = 0;
  // In place: each rank has filled its own parts of `pieces` in `buffer`;
  // afterwards every rank's parts are filled.
  virtual void all_gather_pieces(const at::Tensor& buffer,
                                 const std::vector<Piece>& pieces) = 0;
  // output (n elements) receives slice rank() of the elementwise sum of the
  // ranks' inputs (world() * n elements); `input` is scratch afterwards.
  virtual void reduce_scatter_flat(const at::Tensor& output,
                                   const at::Tensor& input,
                                   ReduceScatterAlgorithm algorithm) = 0;
  virtual void all_reduce(const at::Tensor& tensor, ReduceOp op) = 0;
  virtual void broadcast(const at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;

  // Lanes whose transports share one communicator (NcclTransport: one per
  // group) issue to it in one order on every rank (issue_order.h). Such a
  // transport returns its IssueTurns, through which ProcessGroup hands it
  // each collective's ticket. Transports with a communicator per lane
  // return nullptr.
  virtual IssueTurns* issue_turns() { return nullptr; }

 protected:
  // all_gather_into_flat as all_gather_pieces: copies `input` into this
  // rank's chunk of `output` and gathers the rest as one piece (a flat
  // output is the piecewise layout with a single piece).
  void all_gather_flat_as_one_piece(const at::Tensor& output,
                                    const at::Tensor& input);
  // reduce_scatter_flat as an all_reduce (sum) of the whole input, keeping
  // this rank's slice: each rank sends twice what a ring would.
  void reduce_scatter_by_all_reduce(const at::Tensor& output,
                                    const at::Tensor& input);

 private:
  const int rank_;
  const int world_;
};

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_TRANSPORT_H_
