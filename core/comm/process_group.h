// fsdp2/core/comm/process_group.h
//
// ProcessGroup: a set of ranks and the collectives FSDP needs over them.
//
// Contract:
//  - Every collective is asynchronous and returns a CommHandle; the caller
//    waits on it before reading the output or reusing the input.
//  - Collectives run on one of two lanes (kDefault for parameter all-gathers
//    and general use, kGradient for gradient reductions), each with its own
//    worker thread, so an all-gather can overlap a reduce-scatter. Within a
//    lane, operations run in issue order. Every rank must issue the group's
//    operations in the same order, on the same lanes: with NCCL the two
//    lanes share the group's one communicator and issue to it in the order
//    the operations were issued here (internal/issue_order.h), so the order
//    across both lanes must agree (Gloo and shared memory have a
//    communicator per lane and need the order per lane only).
//  - Errors (including a peer that does not answer within the timeout) are
//    raised from CommHandle::wait() as std::runtime_error whose message names
//    this rank, the collective, the group and the cause.
//  - Reductions are sums. Backends without AVG (Gloo) are averaged by the
//    caller: sum, then divide.
//  - How the bytes travel is chosen once per group and lane, when the group
//    is created (internal/connect_transport.h): when every rank of a group
//    runs on this host, collectives of CPU tensors go through shared memory
//    (internal/shm_transport.h) rather than the backend, except
//    reduce_scatter_flat with an explicit algorithm. FSDP2_SHM=0 in any
//    rank's environment keeps the whole group on the backend.
#ifndef FSDP2_CORE_COMM_PROCESS_GROUP_H_
#define FSDP2_CORE_COMM_PROCESS_GROUP_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/collective_types.h"
#include "core/comm/comm_handle.h"

namespace fsdp2 {
namespace comm {

enum class Lane { kDefault = 0, kGradient = 1 };
constexpr int kNumLanes = 2;

class ProcessGroup {
 public:
  struct Impl;
  // Built by World::new_group(); users do not construct groups directly.
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;  // this process's rank within the group
  int size() const;
  const std::string& name() const;
  const std::vector<int>& global_ranks() const;  // group rank -> world rank
  std::string backend() const;
  std::chrono::milliseconds timeout() const;

  // output (size() * n elements, contiguous) receives every rank's input
  // (n elements, contiguous) in rank order. Same dtype and device.
  CommHandle all_gather_into_flat(at::Tensor output, at::Tensor input,
                                  Lane lane = Lane::kDefault);

  // One rank's part of a piece of a parameter-major buffer (see below).
  using Piece = comm::Piece;
  // All-gather in place into `buffer` (size() * n elements, contiguous),
  // laid out piece by piece: piece i covers elements
  // [size() * offset_i, size() * (offset_i + numel_i)), and rank r's part
  // of it starts at size() * offset_i + r * numel_i. Each rank fills its own
  // parts before calling; afterwards every rank's parts are filled. This is
  // FSDP's unsharded layout (each parameter's rows in rank order), so the
  // parameters view the buffer directly: on Gloo the ring sends and
  // receives every piece where it lives, with no staging buffer and no
  // copy-out; with a native all-gather it stages through a flat buffer.
  CommHandle all_gather_pieces(at::Tensor buffer, std::vector<Piece> pieces,
                               Lane lane = Lane::kDefault);

  // input (size() * n elements, contiguous) is summed elementwise across
  // ranks; output (n elements) receives slice rank() of the sum. `input` is
  // used as scratch space and holds unspecified values afterwards, except
  // that output may be input's own slice (input.narrow(0, rank() * n, n)):
  // the reduction then happens in place, on every transport, and needs no
  // buffer of its own.
  CommHandle reduce_scatter_flat(
      at::Tensor output, at::Tensor input, Lane lane = Lane::kGradient,
      ReduceScatterAlgorithm algorithm = ReduceScatterAlgorithm::kAuto);

  CommHandle all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum,
                        Lane lane = Lane::kDefault);
  CommHandle broadcast(at::Tensor tensor, int root, Lane lane = Lane::kDefault);
  CommHandle barrier(Lane lane = Lane::kDefault);

  // Runs `fn` on `lane` after the operations already queued there: a way to
  // chain host work (copies, a second collective) behind a collective.
  CommHandle submit(Lane lane, std::function<void()> fn);

  // Bytes this rank has sent through this group's collectives, for
  // benchmarks comparing algorithms (ring collectives count exactly; native
  // collectives count the bandwidth-optimal ring volume).
  int64_t bytes_sent() const;

 private:
  std::unique_ptr<Impl> impl_;
};

// Bytes this process has sent through all its groups' collectives (counted
// as bytes_sent() counts them), by the transport each group's lane chose:
// "shm" (shared memory within a host), "gloo" (TCP), "nccl", "single".
std::map<std::string, int64_t> BytesSentByTransport();

}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_PROCESS_GROUP_H_
