#include "core/comm/internal/transport.h"

namespace fsdp2 {
namespace comm {
namespace internal {

void Transport::all_gather_flat_as_one_piece(const at::Tensor& output,
                                             const at::Tensor& input) {
  output.view({world_, -1})[rank_].copy_(input.view(-1));
  all_gather_pieces(output, {Piece{0, input.numel()}});
}

void Transport::reduce_scatter_by_all_reduce(const at::Tensor& output,
                                             const at::Tensor& input) {
  all_reduce(input, ReduceOp::kSum);
  output.view(-1).copy_(input.view({world_, -1})[rank_]);
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
