// fsdp2/core/comm/internal/single_rank_transport.h
//
// SingleRankTransport: the transport of a group of one rank. Its
// collectives move nothing: a gather or reduce-scatter copies the input to
// the output, the rest return at once. No communicator is created for such
// a group. Internal to core/comm; see transport.h for the contract.
#ifndef FSDP2_CORE_COMM_INTERNAL_SINGLE_RANK_TRANSPORT_H_
#define FSDP2_CORE_COMM_INTERNAL_SINGLE_RANK_TRANSPORT_H_

#include "core/comm/internal/transport.h"

namespace fsdp2 {
namespace comm {
namespace internal {

class SingleRankTransport final : public Transport {
 public:
  const char* kind() const override { return "single"; }
  SingleRankTransport() : Transport(/*rank=*/0, /*world=*/1) {}

  void all_gather_into_flat(const at::Tensor& output,
                            const at::Tensor& input) override;
  void all_gather_pieces(const at::Tensor& buffer,
                         const std::vector<Piece>& pieces) override {}
  void reduce_scatter_flat(const at::Tensor& output, const at::Tensor& input,
                           ReduceScatterAlgorithm algorithm) override;
  void all_reduce(const at::Tensor& tensor, ReduceOp op) override {}
  void broadcast(const at::Tensor& tensor, int root) override {}
  void barrier() override {}
};

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_SINGLE_RANK_TRANSPORT_H_
