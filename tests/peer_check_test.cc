// What a rank whose collective failed publishes about its group's lost
// peers (core/comm/internal/peer_check.h): the report names the failure that
// started the check, so a rank that only sees the reporting rank exit (a
// connection closed by it) still learns that the collective timed out.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "core/comm/internal/c10d.h"
#include "core/comm/internal/host.h"
#include "core/comm/internal/peer_check.h"

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

std::string StorePath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/peer_check_" + name;
  std::remove(path.c_str());
  return path;
}

PeerCheck RankZeroOfTwo(c10::intrusive_ptr<::c10d::Store> store) {
  PeerCheck check;
  check.store = std::move(store);
  check.world_rank = 0;
  check.group_ranks = {0, 1};
  check.hosts = {HostIdentity(), HostIdentity()};
  check.wait = std::chrono::milliseconds(200);
  return check;
}

// The report rank 1's watcher reads from `store` within 2 s ("" if none).
std::string SeenByRankOne(c10::intrusive_ptr<::c10d::Store> store) {
  LostReport watcher(std::move(store), 1, std::chrono::milliseconds(20));
  std::string seen;
  for (int i = 0; i < 200 && seen.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen = watcher.seen();
  }
  return seen;
}

TEST(PeerCheck, TheReportCarriesTheFailureThatStartedIt) {
  auto store = c10::make_intrusive<::c10d::FileStore>(StorePath("cause"), 2);
  // Rank 1 never answers: it is lost, and rank 0 publishes what it found.
  const std::string found =
      RankZeroOfTwo(store).Describe("reduce_scatter: timed out after 15000 ms");
  EXPECT_NE(found.find("lost: rank 1"), std::string::npos) << found;
  // What rank 1 reads (it may see only rank 0's exit next).
  const std::string seen = SeenByRankOne(store);
  EXPECT_NE(seen.find("rank 0 (reduce_scatter: timed out after 15000 ms) found lost: rank 1"),
            std::string::npos)
      << seen;
}

TEST(PeerCheck, ALongFailureIsCutShort) {
  auto store = c10::make_intrusive<::c10d::FileStore>(StorePath("long"), 2);
  RankZeroOfTwo(store).Describe("all_gather: " + std::string(5000, 'x'));
  const std::string seen = SeenByRankOne(store);
  ASSERT_NE(seen.find("found lost: rank 1"), std::string::npos) << seen;
  EXPECT_LT(seen.size(), 600u) << seen;
  EXPECT_NE(seen.find("xxx...) found"), std::string::npos) << seen;
}

// A server and a second client connection to it, as World gives a watcher.
struct TcpStorePair {
  TcpStorePair() {
    ::c10d::TCPStoreOptions o;
    o.port = 0;
    o.isServer = true;
    o.waitWorkers = false;
    o.timeout = std::chrono::seconds(30);
    server = c10::make_intrusive<::c10d::TCPStore>("127.0.0.1", o);
    o.isServer = false;
    o.port = server->getPort();
    watch = c10::make_intrusive<::c10d::TCPStore>("127.0.0.1", o);
  }
  c10::intrusive_ptr<::c10d::TCPStore> server, watch;
};

// Polls `ready` every 5 ms for at most `limit`; how long until it held
// (`limit` or more if it never did).
template <typename Ready>
std::chrono::milliseconds TimeUntil(Ready ready, std::chrono::milliseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  auto took = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
  };
  while (!ready() && took() < limit) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return ready() ? took() : std::max(took(), limit);
}

// Over a TCPStore the watcher waits to be woken instead of beating on a
// clock, with the renewal World gives it (LostReport::kWokenRenewal, a day):
// idle, it beats once when it starts and then not at all; a diagnosis's
// wake makes it beat, and a published report is seen within about a second
// (a watcher that ignored its wakes would read it a day later); it stops
// at once when destroyed.
TEST(PeerCheck, AWatcherWokenThroughATcpStoreSeesAReportAtOnceAndIdlesFlat) {
  ASSERT_EQ(LostReport::kWokenRenewal, std::chrono::hours(24));
  TcpStorePair tcp;
  auto beats = [&] { return tcp.server->add(LostReport::HeartbeatKey(1), 0); };
  auto watcher =
      std::make_unique<LostReport>(tcp.watch, 1, LostReport::kWokenRenewal, tcp.server);
  ASSERT_LT(TimeUntil([&] { return beats() >= 1; }, std::chrono::seconds(5)),
            std::chrono::seconds(5))
      << "the watcher never beat";
  // Idle: no beat on any clock.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(beats(), 1) << "the idle watcher beats on a clock instead of waiting to be woken";
  EXPECT_EQ(watcher->seen(), "");
  // A diagnosis wakes it to tell the running from the lost: it beats once.
  tcp.server->set(LostReport::WakeKey(1), {'1'});
  auto took = TimeUntil([&] { return beats() >= 2; }, std::chrono::seconds(5));
  EXPECT_LT(took, std::chrono::seconds(1)) << "the woken watcher beat " << took.count()
                                           << " ms after its wake";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(beats(), 2) << "one wake, one beat";
  // The report's publisher wakes it: seen within about a second.
  LostReport::Publish(*tcp.server, "rank 0 (all_gather: timed out) found lost: rank 2", 3);
  took = TimeUntil([&] { return !watcher->seen().empty(); }, std::chrono::seconds(5));
  EXPECT_LT(took, std::chrono::seconds(1)) << "the report was seen " << took.count()
                                           << " ms after it was published";
  EXPECT_EQ(watcher->seen(), "rank 0 (all_gather: timed out) found lost: rank 2");
  // Destroyed, it is woken to stop, not left to its day-long wait (which
  // the destructor would give up on after 5 s).
  const auto destroying = std::chrono::steady_clock::now();
  watcher.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - destroying, std::chrono::seconds(1));
}

// The wait for a wake is renewed every `period` (the client cancels it and
// waits again on the same connection): after several renewals, with a
// short period here, the watcher still beats when woken and reads a report
// published then, and it stops when destroyed.
TEST(PeerCheck, AWatcherWokenThroughATcpStoreOutlivesItsRenewals) {
  TcpStorePair tcp;
  auto beats = [&] { return tcp.server->add(LostReport::HeartbeatKey(1), 0); };
  std::string seen;
  {
    LostReport watcher(tcp.watch, 1, std::chrono::milliseconds(50), tcp.server);
    // Each renewal beats once: wait for three of them.
    for (int i = 0; i < 1000 && beats() < 4; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GE(beats(), 4) << "the watcher's wait was not renewed";
    EXPECT_EQ(watcher.seen(), "");
    LostReport::Publish(*tcp.server, "rank 0 (all_gather: timed out) found lost: rank 2", 3);
    for (int i = 0; i < 1000 && seen.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      seen = watcher.seen();
    }
  }
  EXPECT_EQ(seen, "rank 0 (all_gather: timed out) found lost: rank 2");
  // A second report does not replace the first.
  LostReport::Publish(*tcp.server, "rank 1 (other) found nothing", 3);
  LostReport late(tcp.server, 1, std::chrono::milliseconds(20));  // on a clock
  for (int i = 0; i < 200 && late.seen().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(late.seen(), seen);
}

}  // namespace
}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
