// fsdp2/core/comm/internal/issue_order.h
//
// IssueOrder: one order of issue for the lanes of a process group whose
// transports share one communicator.
//
// A group runs its collectives on two lanes, each a worker thread, so that
// on the host a reduce-scatter does not wait behind an all-gather. Gloo and shared
// memory give each lane a communicator of its own. NCCL gets one
// communicator per group, as c10d has one per process group, and NCCL
// requires every rank to issue the operations of a communicator in the same
// order: two workers issuing whenever they are ready would not. So each
// collective takes a ticket on the thread that issues it, in program order
// (the same on every rank), and the lanes' workers issue in ticket order:
//
//   int64_t ticket = order.Take();          // issuing thread, in order
//   ... on the lane's worker:
//   IssueOrder::Turn turn(order, ticket);   // waits for ticket - 1 to issue
//   work = backend.allgather(...);          // enqueued on the device
//   turn.Release();                         // the next ticket may issue
//   Wait(work);                             // completion: others go on
//
// A turn covers issuing, not completion: the next collective is enqueued
// while this one runs on the device (on NCCL's one stream per communicator,
// as in PyTorch, the two run one after the other there). A collective made
// of steps that wait for each other (the ring reduce-scatter) holds its
// turn to the end. A failing collective releases its turn (the destructor
// does), so a failure never stalls the collectives behind it. Waiting for a
// turn that does not come within the wait limit throws TimeoutError naming
// the ticket waited for, and breaks the order: every later turn then fails
// at once with the same message, rather than each waiting out the limit.
//
// IssueOrder is thread-safe. A transport whose lanes share an order takes
// its turns through IssueTurns, below: ProcessGroup hands it each
// collective's ticket. Internal to core/comm.
#ifndef FSDP2_CORE_COMM_INTERNAL_ISSUE_ORDER_H_
#define FSDP2_CORE_COMM_INTERNAL_ISSUE_ORDER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

namespace fsdp2 {
namespace comm {
namespace internal {

class IssueOrder {
 public:
  // `wait_limit`: how long a collective waits for its turn before failing.
  explicit IssueOrder(std::chrono::milliseconds wait_limit) : wait_limit_(wait_limit) {}
  IssueOrder(const IssueOrder&) = delete;
  IssueOrder& operator=(const IssueOrder&) = delete;

  // The next place in the order. Every ticket taken must be turned (a Turn
  // constructed for it), or the collectives behind it wait in vain.
  int64_t Take();

  // The ticket whose turn it is now: the collectives before it have issued.
  int64_t next_to_issue() const;
  // Whether a turn timed out (every later turn fails).
  bool broken() const;

  // RAII: this collective's turn to issue.
  class Turn {
   public:
    // Blocks until every ticket before `ticket` has released its turn;
    // throws TimeoutError after the order's wait limit, or at once if the
    // order is broken (the turn then holds nothing and releases nothing).
    Turn(IssueOrder& order, int64_t ticket);
    // Releases the turn if Release() was not called.
    ~Turn();
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

    // The next ticket may issue. Idempotent.
    void Release();

   private:
    IssueOrder& order_;
    const int64_t ticket_;
    bool held_ = true;
  };

 private:
  mutable std::mutex mu_;
  std::condition_variable turned_;
  const std::chrono::milliseconds wait_limit_;
  int64_t taken_ = 0;          // tickets handed out
  int64_t next_to_issue_ = 0;  // the ticket that may issue now
  std::string broken_;         // the timeout that broke the order, if any
};

// A transport's turns in an IssueOrder that its lanes share (NcclTransport:
// one communicator per group), mixed into such a transport, which returns
// itself from Transport::issue_turns(). ProcessGroup takes a ticket from
// issue_order() for each collective on the issuing thread and, on the
// lane's worker, hands it over with set_ticket() before calling the
// collective, which takes its turn (TakeTurn) before it issues; afterwards
// turn_unused_ticket(). One collective at a time per transport (the lane's
// worker), as transport.h's contract says.
class IssueTurns {
 public:
  explicit IssueTurns(IssueOrder& order) : order_(order) {}
  IssueTurns(const IssueTurns&) = delete;
  IssueTurns& operator=(const IssueTurns&) = delete;

  // The order shared with the other lanes.
  IssueOrder* issue_order() { return &order_; }
  // The ticket of the collective this transport runs next.
  void set_ticket(int64_t ticket) { ticket_ = ticket; }
  // After a collective: if it failed before taking its turn, takes and
  // releases the turn now, so that the collectives behind it still issue.
  void turn_unused_ticket() noexcept;

 protected:
  ~IssueTurns() = default;

  // This collective's turn, taken with the ticket ProcessGroup handed over
  // (set_ticket), or, for a transport driven directly from one thread with
  // nothing else pending (tests), the next ticket (std::logic_error if
  // others are pending). Blocks until the collectives before it have
  // issued.
  IssueOrder::Turn TakeTurn();

 private:
  IssueOrder& order_;
  int64_t ticket_ = -1;
};

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_ISSUE_ORDER_H_
