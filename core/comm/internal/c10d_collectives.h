// fsdp2/core/comm/internal/c10d_collectives.h
//
// Collectives built on a c10d backend's own operations, shared by the
// transports over c10d (GlooTransport, NcclTransport): waiting on a c10d
// Work within the timeout, rings of send/recv for the piecewise all-gather
// and the reduce-scatter, and the plain all-reduce and broadcast. Each
// function is one collective: every rank of the backend's group calls it
// with the same arguments (tensors aside) in the same order, and it returns
// when this rank's part is done (an Issue* function: when it is enqueued).
// Failures throw. Internal to core/comm.
#ifndef FSDP2_CORE_COMM_INTERNAL_C10D_COLLECTIVES_H_
#define FSDP2_CORE_COMM_INTERNAL_C10D_COLLECTIVES_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <vector>

#include "core/comm/collective_types.h"
#include "core/comm/internal/c10d.h"

namespace fsdp2 {
namespace comm {
namespace internal {

// Waits for `work`; throws std::runtime_error if it has not finished
// within `timeout`, and rethrows its error if it failed.
void Wait(const c10::intrusive_ptr<::c10d::Work>& work,
          std::chrono::milliseconds timeout);

// All-gather of a piecewise buffer (Transport::all_gather_pieces) as a ring
// of send/recv, one message per piece and step: W - 1 steps, every piece
// sent and received where it lives, no extra buffers.
void RingAllGatherPieces(::c10d::Backend& backend, int rank, int world,
                         std::chrono::milliseconds timeout,
                         const at::Tensor& buffer,
                         const std::vector<Piece>& pieces);

// Reduce-scatter (Transport::reduce_scatter_flat) as a ring of send/recv:
// each rank sends (W-1)/W of the input, half of what a ring all-reduce
// sends. `scratch` is the caller's receive buffer, kept between calls
// (allocating tens of MiB afresh each call costs page faults); it is
// replaced when too small or of another dtype or device.
void RingReduceScatter(::c10d::Backend& backend, int rank, int world,
                       std::chrono::milliseconds timeout,
                       const at::Tensor& output, const at::Tensor& input,
                       at::Tensor& scratch);

// The backend's own all-reduce of `tensor` in place, in two steps: Issue*
// enqueues it and returns the Work to wait on (a transport whose lanes
// share one communicator lets the next collective issue in between), and
// the one-step form is Wait(Issue*(...), timeout).
c10::intrusive_ptr<::c10d::Work> IssueAllReduce(::c10d::Backend& backend,
                                                const at::Tensor& tensor, ReduceOp op);
void AllReduce(::c10d::Backend& backend, std::chrono::milliseconds timeout,
               const at::Tensor& tensor, ReduceOp op);

// The backend's own broadcast from `root`, in place, in the same two
// steps. Pure data movement: bfloat16 travels bit for bit as float16,
// which every backend carries (LibTorch 1.13's Gloo rejects bfloat16).
c10::intrusive_ptr<::c10d::Work> IssueBroadcastBits(::c10d::Backend& backend,
                                                    const at::Tensor& tensor, int root);
void BroadcastBits(::c10d::Backend& backend, std::chrono::milliseconds timeout,
                   const at::Tensor& tensor, int root);

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_C10D_COLLECTIVES_H_
