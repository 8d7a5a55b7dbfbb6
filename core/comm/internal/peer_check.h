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
//
// The watcher beats (counts this rank's heartbeat up) and reads the report.
// Over a TCPStore it does so when woken, not on a clock: a diagnosis wakes
// the ranks that did not answer it, to tell the running from the lost, and
// the report's publisher wakes every rank. Idle, each rank then makes 3
// store requests per `period` (its wait for a wake times out and is
// renewed): the store's load from liveness is world size x 3 / `period`
// per second, which World bounds by lengthening `period` with the world
// size. Over a FileStore (no `waker`) it beats every `period`.
class LostReport {
 public:
  // Starts the watcher on `store` (its own client connection when woken by
  // the store: it is blocked in a wait most of the time). With a `waker`
  // (another connection to the store), the watcher waits for wakes and the
  // destructor wakes it through `waker`; without, it beats every `period`.
  // The destructor returns within about 5 s even where the store no longer
  // answers.
  LostReport(c10::intrusive_ptr<::c10d::Store> store, int rank,
             std::chrono::milliseconds period,
             c10::intrusive_ptr<::c10d::Store> waker = nullptr);
  static std::string HeartbeatKey(int rank);
  // The `period` World gives a watcher woken through a TCPStore. A day:
  // LibTorch's client logs a warning each time a wait times out (every
  // rank, every renewal), and nothing needs the renewal sooner (a diagnosis
  // and a report wake the watchers; a store that goes away ends the wait).
  // Idle, 3 requests a rank a day.
  static constexpr std::chrono::milliseconds kWokenRenewal = std::chrono::hours(24);
  // The key whose setting wakes `rank`'s watcher.
  static std::string WakeKey(int rank);
  ~LostReport();
  LostReport(const LostReport&) = delete;
  LostReport& operator=(const LostReport&) = delete;

  // The last report seen ("" if none).
  std::string seen() const;
  // Publishes `report` unless one was published before, and wakes the
  // watchers of ranks 0 .. world - 1 to read it (one request for all).
  static void Publish(::c10d::Store& store, const std::string& report, int world);

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
  // to do the same (halfway through, it wakes the watchers of those that
  // have not), and describes the result for an error message: a rank that
  // did not answer and whose watcher did not beat is lost ("lost: rank 3
  // (host 'node1') ..."), one whose watcher beat is still running, or
  // "every rank of the group is still alive" or, when the store itself is
  // gone, what that means and what another rank reported before. Publishes
  // what it finds, with `failure` (what failed on this rank, e.g.
  // "all_gather: timed out after 15000 ms") so that a rank which only sees
  // this one exit learns the cause as well. Never throws, and returns
  // within about `wait` + 5 s even where the store no longer answers (a
  // host cut off from rank 0's: LibTorch 2.x's store client would wait for
  // its reply forever). Its store requests do not grow with the group's
  // size: about `wait` / 100 ms polls of a counter, reads of the list of
  // those that answered (a few bytes a rank) when the counter says that all
  // may have, halfway and at the end, and two per rank that did not answer.
  std::string Describe(const std::string& failure) const;
};

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_PEER_CHECK_H_
