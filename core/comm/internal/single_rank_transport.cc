#include "core/comm/internal/single_rank_transport.h"

namespace fsdp2 {
namespace comm {
namespace internal {

void SingleRankTransport::all_gather_into_flat(const at::Tensor& output,
                                               const at::Tensor& input) {
  output.view(-1).copy_(input.view(-1));
}

void SingleRankTransport::reduce_scatter_flat(
    const at::Tensor& output, const at::Tensor& input,
    ReduceScatterAlgorithm /*algorithm*/) {
  output.view(-1).copy_(input.view(-1));
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
