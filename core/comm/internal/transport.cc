#include "core/comm/internal/transport.h"

#include <stdexcept>

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

IssueOrder::Turn Transport::TakeTurn() {
  IssueOrder& order = *issue_order();
  int64_t ticket = ticket_;
  ticket_ = -1;
  if (ticket < 0) {
    // Driven directly: only right when nothing else is in the order, else
    // this ticket would come after collectives queued behind it.
    ticket = order.Take();
    if (ticket != order.next_to_issue()) {
      throw std::logic_error(
          "fsdp2: a collective without a ticket on a transport whose lanes share one "
          "communicator, while other collectives are pending; issue it through ProcessGroup");
    }
  }
  return IssueOrder::Turn(order, ticket);
}

void Transport::turn_unused_ticket() noexcept {
  IssueOrder* order = issue_order();
  if (order == nullptr || ticket_ < 0) return;
  const int64_t ticket = ticket_;
  ticket_ = -1;
  try {
    IssueOrder::Turn turn(*order, ticket);
  } catch (...) {
    // Timed out: the order is broken, and the collectives behind it fail at once.
  }
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
