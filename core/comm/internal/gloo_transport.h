// fsdp2/core/comm/internal/gloo_transport.h
//
// GlooTransport: a lane's collectives over c10d's Gloo backend, on CPU
// tensors between hosts (or between local ranks without shared memory).
// It does on Gloo what the engine needs in a way that keeps working on every
// Gloo it has met (1.13's lacked all three):
//   - no flat all-gather (_allgather_base) and no reduce-scatter: both are
//     rings of send/recv (c10d_collectives.h); the all-gather sends and
//     receives every piece where it lives, with no staging buffer;
//   - no 16-bit float reductions: bfloat16 and float16 are reduced in fp32;
//   - no bfloat16 at all: broadcasts carry bfloat16 bits as float16.
// Internal to core/comm; see transport.h for the contract.
#ifndef FSDP2_CORE_COMM_INTERNAL_GLOO_TRANSPORT_H_
#define FSDP2_CORE_COMM_INTERNAL_GLOO_TRANSPORT_H_

#include <chrono>
#include <memory>

#include "core/comm/internal/c10d.h"
#include "core/comm/internal/gloo_backend.h"
#include "core/comm/internal/transport.h"

namespace fsdp2 {
namespace comm {
namespace internal {

class GlooTransport final : public Transport {
 public:
  const char* kind() const override { return "gloo"; }
  // Collective over the `world` ranks sharing `store` (prefixed for this
  // group and lane): creates their Gloo communicator on `device`. Every
  // later operation fails after `timeout`. Throws if the communicator
  // cannot be created.
  static std::unique_ptr<GlooTransport> Connect(
      const c10::intrusive_ptr<::c10d::Store>& store, int rank, int world,
      const std::shared_ptr<GlooDevice>& device,
      std::chrono::milliseconds timeout);

  GlooTransport(c10::intrusive_ptr<::c10d::Backend> gloo, int rank, int world,
                std::chrono::milliseconds timeout);

  void all_gather_into_flat(const at::Tensor& output,
                            const at::Tensor& input) override;
  void all_gather_pieces(const at::Tensor& buffer,
                         const std::vector<Piece>& pieces) override;
  // kAuto and kRing: the ring; kAllReduce: an all-reduce.
  void reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                           ReduceScatterAlgorithm algorithm) override;
  void all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  void broadcast(const at::Tensor& tensor, int root) override;
  void barrier() override;

 private:
  c10::intrusive_ptr<::c10d::Backend> gloo_;
  std::chrono::milliseconds timeout_;
  at::Tensor ring_scratch_;  // receive buffer of the ring reduce-scatter
};

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_GLOO_TRANSPORT_H_
