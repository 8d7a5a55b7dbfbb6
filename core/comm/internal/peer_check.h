// fsdp2/core/comm/internal/peer_check.h
//
// After a collective fails, which peers are gone? A failed Gloo connection
// names an address ("Connection reset by peer [10.0.0.2]:41003"), and the
// rank next to a dead one often sees only its neighbour's reaction. This
// asks the rendezvous store instead: every rank whose collective failed
// says so there and waits briefly for the others of the group; the ranks
// that never answer are the lost ones. Internal to core/comm.
#ifndef FSDP2_CORE_COMM_INTERNAL_PEER_CHECK_H_
#define FSDP2_CORE_COMM_INTERNAL_PEER_CHECK_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/internal/c10d.h"

namespace fsdp2 {
namespace comm {
namespace internal {

// What the first rank to diagnose a failure found ("lost: rank 3 ..."), as
// published in the store, and a watcher that keeps a copy of it: a rank
// whose collective fails only because a diagnosing rank exited (taking the
// store with it, when it was rank 0) still names the rank that was lost.
class LostReport {
 public:
  // Starts a thread that, every `period` until destroyed, counts this
  // rank's heartbeat up in `store` (its own client connection) and reads
  // the report.
  LostReport(c10::intrusive_ptr<::c10d::Store> store, int rank,
             std::chrono::milliseconds period);
  static std::string HeartbeatKey(int rank);
  ~LostReport();
  LostReport(const LostReport&) = delete;
  LostReport& operator=(const LostReport&) = delete;

  // The last report seen ("" if none).
  std::string seen() const;
  static void Publish(::c10d::Store& store, const std::string& report);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

struct PeerCheck {
  c10::intrusive_ptr<::c10d::Store> store;  // the world's store
  int world_rank = 0;                       // this rank
  std::vector<int> group_ranks;             // world ranks of the group
  std::vector<std::string> hosts;           // host identity of every world rank
  std::chrono::milliseconds wait{std::chrono::seconds(5)};
  std::shared_ptr<LostReport> report;       // may be null

  // Marks this rank alive, waits up to `wait` for the group's other ranks
  // to do the same, and describes the result for an error message: a rank
  // that did not answer and whose heartbeat stopped is lost ("lost: rank 3
  // (host 'node1') ..."), one whose heartbeat goes on is still running, or
  // "every rank of the group is still alive" or, when the store itself is
  // gone, what that means and what another rank reported before. Publishes
  // what it finds, with `failure` (what failed on this rank, e.g.
  // "all_gather: timed out after 15000 ms") so that a rank which only sees
  // this one exit learns the cause as well. Never throws, and returns
  // within about `wait` + 5 s even where the store no longer answers (a
  // host cut off from rank 0's: LibTorch 2.x's store client would wait for
  // its reply forever).
  std::string Describe(const std::string& failure) const;
};

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_PEER_CHECK_H_
