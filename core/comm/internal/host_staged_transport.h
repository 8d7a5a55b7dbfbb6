// fsdp2/core/comm/internal/host_staged_transport.h
//
// HostStagedTransport: collectives of a host transport (Gloo, shared
// memory) on device tensors, through host copies. Each call whose tensors
// are all on the CPU goes straight to the inner transport; otherwise the
// device tensors are copied to host memory (a synchronous copy, which
// waits for the work queued before it on the calling thread's stream), the
// inner transport runs on the copies, and the results are copied back.
//
// What it is for: ranks that share one GPU (NCCL refuses two ranks on one
// device) and a gloo process group whose ranks hold CUDA tensors. It costs
// two copies across the PCIe bus per collective, so it is a way to run the
// engine's multi-rank logic on CUDA tensors, not a fast path: give each
// rank its own GPU and the nccl backend for speed.
// Internal to core/comm; see transport.h for the contract.
#ifndef FSDP2_CORE_COMM_INTERNAL_HOST_STAGED_TRANSPORT_H_
#define FSDP2_CORE_COMM_INTERNAL_HOST_STAGED_TRANSPORT_H_

#include <memory>

#include "core/comm/internal/transport.h"

namespace fsdp2 {
namespace comm {
namespace internal {

class HostStagedTransport final : public Transport {
 public:
  explicit HostStagedTransport(std::unique_ptr<Transport> host);

  const char* kind() const override { return host_->kind(); }
  void all_gather_into_flat(const at::Tensor& output,
                            const at::Tensor& input) override;
  void all_gather_pieces(const at::Tensor& buffer,
                         const std::vector<Piece>& pieces) override;
  void reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                           ReduceScatterAlgorithm algorithm) override;
  void all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  void broadcast(const at::Tensor& tensor, int root) override;
  void barrier() override { host_->barrier(); }

 private:
  std::unique_ptr<Transport> host_;
};

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_HOST_STAGED_TRANSPORT_H_
