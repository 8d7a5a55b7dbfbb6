// The lanes of a process group whose transports share one communicator
// (NCCL: one per group) must issue to it in the order the collectives were
// issued, the same on every rank, however each lane's worker is scheduled.
// Checked on the CPU with transports that record when each collective
// issues: the default lane's are slow to start, the gradient lane's fast, so
// without the shared order the gradient lane's collectives would issue
// first.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/internal/issue_order.h"
#include "core/comm/internal/process_group_impl.h"
#include "core/comm/internal/transport.h"
#include "core/comm/process_group.h"
#include "core/common/error.h"

namespace fsdp2 {
namespace testing {
namespace {

using comm::Lane;
using comm::internal::IssueOrder;
using std::chrono::milliseconds;

// What every lane's transport appends to when its collective issues.
struct IssueLog {
  std::mutex mu;
  std::vector<std::string> issued;
  void Add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    issued.push_back(what);
  }
};

// A group of one rank whose lanes share `order`: each
// collective waits `delay` on its lane's worker, takes its turn, then
// records its name (the tensor's first value) as issued. A tensor whose
// first value is negative fails before taking its turn.
class RecordingTransport final : public comm::internal::Transport,
                                 public comm::internal::IssueTurns {
 public:
  RecordingTransport(std::shared_ptr<IssueOrder> order, std::shared_ptr<IssueLog> log,
                     std::string lane, milliseconds delay)
      : Transport(0, 1), IssueTurns(*order), order_(std::move(order)), log_(std::move(log)),
        lane_(std::move(lane)), delay_(delay) {}

  const char* kind() const override { return "recording"; }
  IssueTurns* issue_turns() override { return this; }

  void all_gather_into_flat(const at::Tensor& output, const at::Tensor&) override {
    Issue("all_gather", output);
  }
  void all_gather_pieces(const at::Tensor& buffer, const std::vector<comm::Piece>&) override {
    Issue("all_gather_pieces", buffer);
  }
  void reduce_scatter_flat(const at::Tensor& output, const at::Tensor&,
                           comm::ReduceScatterAlgorithm) override {
    Issue("reduce_scatter", output);
  }
  void all_reduce(const at::Tensor& tensor, comm::ReduceOp) override {
    Issue("all_reduce", tensor);
  }
  void broadcast(const at::Tensor& tensor, int) override { Issue("broadcast", tensor); }
  void barrier() override { Issue("barrier", at::Tensor()); }

 private:
  void Issue(const std::string& op, const at::Tensor& t) {
    std::this_thread::sleep_for(delay_);
    const int64_t id = t.defined() ? t.view(-1)[0].item<int64_t>() : 0;
    if (id < 0) throw std::runtime_error("refused before issuing");
    IssueOrder::Turn turn = TakeTurn();
    log_->Add(op + " " + std::to_string(id) + " on " + lane_);
  }

  std::shared_ptr<IssueOrder> order_;
  std::shared_ptr<IssueLog> log_;
  const std::string lane_;
  const milliseconds delay_;
};

std::unique_ptr<comm::ProcessGroup> Group(const std::shared_ptr<IssueLog>& log,
                                          milliseconds wait_limit = std::chrono::seconds(30)) {
  auto impl = std::make_unique<comm::ProcessGroup::Impl>();
  impl->name = "recording";
  impl->global_ranks = {0};
  impl->timeout = wait_limit;
  auto order = std::make_shared<IssueOrder>(wait_limit);
  impl->transports[static_cast<int>(Lane::kDefault)] =
      std::make_unique<RecordingTransport>(order, log, "default", milliseconds(25));
  impl->transports[static_cast<int>(Lane::kGradient)] =
      std::make_unique<RecordingTransport>(order, log, "gradient", milliseconds(0));
  for (auto& lane : impl->lanes) lane = std::make_unique<comm::CommLane>("recording");
  return std::make_unique<comm::ProcessGroup>(std::move(impl));
}

at::Tensor Id(int64_t id) { return at::full({1}, id, at::kLong); }

TEST(IssueOrder, LanesIssueInTheOrderCollectivesWereIssued) {
  auto log = std::make_shared<IssueLog>();
  auto group = Group(log);
  // As FSDP issues them: a unit's all-gather, the next unit's, the first
  // reduce-scatter, an all-reduce on the gradient lane, ...
  std::vector<comm::CommHandle> handles;
  handles.push_back(group->all_gather_into_flat(Id(1), Id(1)));
  handles.push_back(group->all_gather_pieces(Id(2), {{0, 1}}));
  handles.push_back(group->reduce_scatter_flat(Id(3), Id(3)));
  handles.push_back(group->all_reduce(Id(4), comm::ReduceOp::kSum, Lane::kGradient));
  handles.push_back(group->broadcast(Id(5), 0));
  handles.push_back(group->reduce_scatter_flat(Id(6), Id(6)));
  handles.push_back(group->barrier(Lane::kGradient));
  handles.push_back(group->all_reduce(Id(7), comm::ReduceOp::kMax));
  for (const auto& h : handles) h.wait();
  const std::vector<std::string> expected = {
      "all_gather 1 on default",     "all_gather_pieces 2 on default",
      "reduce_scatter 3 on gradient", "all_reduce 4 on gradient",
      "broadcast 5 on default",       "reduce_scatter 6 on gradient",
      "barrier 0 on gradient",        "all_reduce 7 on default"};
  EXPECT_EQ(log->issued, expected);
}

TEST(IssueOrder, ACollectiveThatFailsBeforeIssuingDoesNotStallTheOthers) {
  auto log = std::make_shared<IssueLog>();
  auto group = Group(log);
  comm::CommHandle failed = group->all_gather_into_flat(Id(-1), Id(-1));
  comm::CommHandle next = group->reduce_scatter_flat(Id(2), Id(2));
  comm::CommHandle after = group->all_reduce(Id(3));
  EXPECT_THROW(failed.wait(), CommunicationError);
  next.wait();
  after.wait();
  EXPECT_EQ(log->issued,
            (std::vector<std::string>{"reduce_scatter 2 on gradient", "all_reduce 3 on default"}));
}

TEST(IssueOrder, TurnsComeInTicketOrderWhateverTheThreads) {
  IssueOrder order(std::chrono::seconds(30));
  std::vector<int64_t> tickets;
  for (int i = 0; i < 16; ++i) tickets.push_back(order.Take());
  std::mutex mu;
  std::vector<int64_t> issued;
  std::vector<std::thread> threads;
  // Started last ticket first: each waits for the ones before it.
  for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) {
    threads.emplace_back([&, ticket = *it] {
      IssueOrder::Turn turn(order, ticket);
      std::lock_guard<std::mutex> lock(mu);
      issued.push_back(ticket);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(issued, tickets);
  EXPECT_EQ(order.next_to_issue(), 16);
}

TEST(IssueOrder, ATurnThatNeverComesIsANamedTimeout) {
  IssueOrder order(milliseconds(50));
  order.Take();  // ticket 0, never turned
  const int64_t late = order.Take();
  try {
    IssueOrder::Turn turn(order, late);
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("collective 1 of this group waited 50 ms"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(order.next_to_issue(), 0);
}

// After one turn times out the group's order is broken: later turns fail
// at once with that first timeout, instead of each waiting out the limit.
TEST(IssueOrder, ATimeoutBreaksTheOrderForTheTurnsBehindIt) {
  IssueOrder order(milliseconds(50));
  order.Take();  // ticket 0, never turned
  const int64_t first = order.Take(), second = order.Take();
  EXPECT_THROW(IssueOrder::Turn(order, first), TimeoutError);
  EXPECT_TRUE(order.broken());
  try {
    IssueOrder::Turn turn(order, second);
    FAIL() << "expected the order to stay broken";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("collective 1 of this group"), std::string::npos)
        << e.what();
  }
}

// A transport driven without ProcessGroup's ticket while another collective
// is pending would issue out of order: refused.
TEST(IssueOrder, ACollectiveWithoutATicketWhileOthersArePendingIsRefused) {
  auto log = std::make_shared<IssueLog>();
  auto order = std::make_shared<IssueOrder>(std::chrono::seconds(30));
  RecordingTransport direct(order, log, "direct", milliseconds(0));
  direct.all_reduce(Id(1), comm::ReduceOp::kSum);  // nothing pending: fine
  order->Take();                                    // a collective in flight elsewhere
  EXPECT_THROW(direct.all_reduce(Id(2), comm::ReduceOp::kSum), std::logic_error);
  EXPECT_EQ(log->issued, std::vector<std::string>{"all_reduce 1 on direct"});
}

TEST(IssueOrder, AnEarlyReleaseLetsTheNextIssueBeforeThisOneEnds) {
  IssueOrder order(std::chrono::seconds(30));
  const int64_t first = order.Take(), second = order.Take();
  IssueOrder::Turn turn(order, first);
  turn.Release();
  IssueOrder::Turn next(order, second);  // would wait 30 s without the release
  turn.Release();                        // idempotent: nothing more released
  EXPECT_EQ(order.next_to_issue(), 1);
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2
