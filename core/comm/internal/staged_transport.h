// fsdp2/core/comm/internal/staged_transport.h
//
// StagedTransport: collectives on tensors that the inner transport cannot
// carry, through copies that it can. The inner transport carries tensors on
// one side of the bus, in one of two directions:
//   ThroughHost    a host transport (Gloo, shared memory) carries CPU
//                  tensors: device tensors are copied to host memory. For
//                  ranks that share one GPU (NCCL refuses two ranks on one
//                  device) and gloo groups whose ranks hold CUDA tensors;
//                  it costs two copies across the PCIe bus per collective,
//                  a way to run the engine's multi-rank logic on CUDA
//                  tensors, not a fast path (give each rank its own GPU and
//                  the nccl backend for speed).
//   ThroughDevice  NCCL carries device tensors: CPU tensors (the flags and
//                  counts that checkpoints and loads exchange) are copied
//                  to the group's GPU.
// A call whose tensors are all on the carried side goes straight to the
// inner transport. Otherwise each tensor on the other side is replaced by a
// copy on the carried side (a synchronous copy, which waits for the work
// queued before it on the calling thread's stream; an output that the
// collective overwrites whole is allocated, not copied), the inner
// transport runs on the copies, and the results are copied back.
//
// Everything else is the inner transport's: its kind(), its barrier() and
// its issue turns (issue_order.h). Internal to core/comm; see transport.h
// for the contract.
#ifndef FSDP2_CORE_COMM_INTERNAL_STAGED_TRANSPORT_H_
#define FSDP2_CORE_COMM_INTERNAL_STAGED_TRANSPORT_H_

#include <c10/core/Device.h>

#include <functional>
#include <memory>

#include "core/comm/internal/transport.h"

namespace fsdp2 {
namespace comm {
namespace internal {

class StagedTransport final : public Transport {
 public:
  // `host` carries CPU tensors; device tensors travel through host copies.
  static std::unique_ptr<StagedTransport> ThroughHost(std::unique_ptr<Transport> host);
  // `device_transport` carries tensors on `device`'s type (CUDA); CPU
  // tensors travel through copies on `device`.
  static std::unique_ptr<StagedTransport> ThroughDevice(
      std::unique_ptr<Transport> device_transport, const at::Device& device);

  // Use the factories above: `carried` is where the inner transport's
  // tensors must be (the CPU, or a GPU).
  StagedTransport(std::unique_ptr<Transport> inner, const at::Device& carried);

  const char* kind() const override { return inner_->kind(); }
  IssueTurns* issue_turns() override { return inner_->issue_turns(); }

  void all_gather_into_flat(const at::Tensor& output,
                            const at::Tensor& input) override;
  void all_gather_pieces(const at::Tensor& buffer,
                         const std::vector<Piece>& pieces) override;
  void reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                           ReduceScatterAlgorithm algorithm) override;
  void all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  void broadcast(const at::Tensor& tensor, int root) override;
  void barrier() override { inner_->barrier(); }

 private:
  // Whether the inner transport carries `t` as it is.
  bool Carried(const at::Tensor& t) const;
  // `t` itself if carried, else a copy of it on the carried side.
  at::Tensor Stage(const at::Tensor& t) const;
  // `output` itself if carried, else an uninitialised tensor like it on the
  // carried side (for an output the collective overwrites whole).
  at::Tensor StageOutput(const at::Tensor& output) const;
  // Writes a staged result back into `original` (nothing if it was carried).
  void Unstage(const at::Tensor& original, const at::Tensor& staged) const;

  // Runs `collective` on `tensor` (read and written in place), staged if
  // it is not carried.
  using InPlaceCollective = std::function<void(const at::Tensor&)>;
  void InPlace(const at::Tensor& tensor, const InPlaceCollective& collective);
  // Runs `collective(output, input)` on `input` staged if not carried and
  // `output` likewise (allocated: the collective overwrites it whole).
  using OutOfPlaceCollective = std::function<void(const at::Tensor&, const at::Tensor&)>;
  void OutOfPlace(const at::Tensor& output, const at::Tensor& input,
                  const OutOfPlaceCollective& collective);

  std::unique_ptr<Transport> inner_;
  const at::Device carried_;
};

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_STAGED_TRANSPORT_H_
