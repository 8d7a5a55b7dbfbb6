#include "core/comm/internal/issue_order.h"

#include <stdexcept>
#include <string>

#include "core/common/error.h"

namespace fsdp2 {
namespace comm {
namespace internal {

int64_t IssueOrder::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_++;
}

int64_t IssueOrder::next_to_issue() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_to_issue_;
}

bool IssueOrder::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !broken_.empty();
}

IssueOrder::Turn::Turn(IssueOrder& order, int64_t ticket) : order_(order), ticket_(ticket) {
  std::unique_lock<std::mutex> lock(order_.mu_);
  const bool turned = order_.turned_.wait_for(lock, order_.wait_limit_, [&] {
    return order_.next_to_issue_ == ticket_ || !order_.broken_.empty();
  });
  if (turned && order_.broken_.empty()) return;
  held_ = false;
  if (order_.broken_.empty()) {
    order_.broken_ = "collective " + std::to_string(ticket_) + " of this group waited " +
                     std::to_string(order_.wait_limit_.count()) +
                     " ms for its turn to issue; collective " +
                     std::to_string(order_.next_to_issue_) + " has not issued";
    order_.turned_.notify_all();  // the others fail now, not after their own wait
  }
  throw TimeoutError(order_.broken_);
}

IssueOrder::Turn::~Turn() { Release(); }

void IssueOrder::Turn::Release() {
  if (!held_) return;
  held_ = false;
  {
    std::lock_guard<std::mutex> lock(order_.mu_);
    ++order_.next_to_issue_;
  }
  order_.turned_.notify_all();
}

IssueOrder::Turn IssueTurns::TakeTurn() {
  int64_t ticket = ticket_;
  ticket_ = -1;
  if (ticket < 0) {
    // Driven directly: only right when nothing else is in the order, else
    // this ticket would come after collectives queued behind it.
    ticket = order_.Take();
    if (ticket != order_.next_to_issue()) {
      throw std::logic_error(
          "fsdp2: a collective without a ticket on a transport whose lanes share one "
          "communicator, while other collectives are pending; issue it through ProcessGroup");
    }
  }
  return IssueOrder::Turn(order_, ticket);
}

void IssueTurns::turn_unused_ticket() noexcept {
  if (ticket_ < 0) return;
  const int64_t ticket = ticket_;
  ticket_ = -1;
  try {
    IssueOrder::Turn turn(order_, ticket);
  } catch (...) {
    // Timed out: the order is broken, and the collectives behind it fail at once.
  }
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
