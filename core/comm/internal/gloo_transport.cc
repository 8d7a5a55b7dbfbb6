#include "core/comm/internal/gloo_transport.h"

#include <ATen/ATen.h>

#include "core/comm/internal/c10d_collectives.h"

namespace fsdp2 {
namespace comm {
namespace internal {

std::unique_ptr<GlooTransport> GlooTransport::Connect(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int world,
    const std::shared_ptr<GlooDevice>& device,
    std::chrono::milliseconds timeout) {
  return std::make_unique<GlooTransport>(
      ConnectGlooBackend(store, rank, world, device, timeout), rank, world,
      timeout);
}

GlooTransport::GlooTransport(c10::intrusive_ptr<::c10d::Backend> gloo, int rank,
                             int world, std::chrono::milliseconds timeout)
    : Transport(rank, world), gloo_(std::move(gloo)), timeout_(timeout) {}

void GlooTransport::all_gather_into_flat(const at::Tensor& output,
                                         const at::Tensor& input) {
  all_gather_flat_as_one_piece(output, input);
}

void GlooTransport::all_gather_pieces(const at::Tensor& buffer,
                                      const std::vector<Piece>& pieces) {
  RingAllGatherPieces(*gloo_, rank(), world(), timeout_, buffer, pieces);
}

void GlooTransport::reduce_scatter_flat(const at::Tensor& output,
                                        const at::Tensor& input,
                                        ReduceScatterAlgorithm algorithm) {
  if (algorithm == ReduceScatterAlgorithm::kAllReduce) {
    reduce_scatter_by_all_reduce(output, input);
    return;
  }
  RingReduceScatter(*gloo_, rank(), world(), timeout_, output, input,
                    ring_scratch_);
}

void GlooTransport::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  const bool upcast = tensor.scalar_type() == at::kBFloat16 ||
                      tensor.scalar_type() == at::kHalf;
  if (!upcast) {
    AllReduce(*gloo_, timeout_, tensor, op);
    return;
  }
  at::Tensor wide = tensor.to(at::kFloat);
  AllReduce(*gloo_, timeout_, wide, op);
  tensor.copy_(wide);
}

void GlooTransport::broadcast(const at::Tensor& tensor, int root) {
  BroadcastBits(*gloo_, timeout_, tensor, root);
}

void GlooTransport::barrier() { Wait(gloo_->barrier(), timeout_); }

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
