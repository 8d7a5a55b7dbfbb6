#include "core/comm/internal/peer_check.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <future>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/comm/internal/host.h"

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

std::string AliveKey(int rank) { return "fsdp2/alive_after_failure/" + std::to_string(rank); }
const char kReportKey[] = "fsdp2/lost_report";

// Runs `requests` (store requests) on a thread of its own and waits at most
// `limit` for them; false if they did not finish in time (or threw). A
// TCPStore client of LibTorch 2.x waits for each reply with no time limit,
// so on a host that lost the network a request never returns: the thread
// is then left behind, owning what `requests` captured (the store among
// it), while the rank goes on to report its error and exit.
bool RunWithin(std::chrono::milliseconds limit, std::function<void()> requests) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false, ok = false;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, requests = std::move(requests)] {
    bool ok = true;
    try {
      requests();
    } catch (const std::exception&) {
      ok = false;
    }
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->done = true;
    shared->ok = ok;
    shared->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mu);
  return shared->cv.wait_for(lock, limit, [&] { return shared->done; }) && shared->ok;
}

// How long a heartbeat or a diagnosis's requests may take beyond their own
// waiting before the store counts as unreachable.
constexpr std::chrono::seconds kStoreReplyLimit{5};

}  // namespace

struct LostReport::State {
  std::mutex mu;
  std::condition_variable stop_cv;
  bool stop = false;
  std::string seen;
  std::thread thread;
};

std::string LostReport::HeartbeatKey(int rank) {
  return "fsdp2/heartbeat/" + std::to_string(rank);
}

LostReport::LostReport(c10::intrusive_ptr<::c10d::Store> store, int rank,
                       std::chrono::milliseconds period)
    : state_(std::make_shared<State>()) {
  state_->thread = std::thread([state = state_, store, rank, period] {
    std::unique_lock<std::mutex> lock(state->mu);
    while (!state->stop_cv.wait_for(lock, period, [&] { return state->stop; })) {
      lock.unlock();
      std::string report;
      try {
        store->add(HeartbeatKey(rank), 1);
        if (store->check({kReportKey})) {
          auto v = store->get(kReportKey);
          report.assign(v.begin(), v.end());
        }
      } catch (const std::exception&) {
        return;  // the store is gone: keep what was seen
      }
      lock.lock();
      if (!report.empty()) state->seen = report;
    }
  });
}

LostReport::~LostReport() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->stop_cv.notify_all();
  if (!state_->thread.joinable()) return;
  // A heartbeat stuck in a store request on a host that lost the network
  // never returns (see RunWithin); the thread owns its state and store.
  auto finished = std::make_shared<std::promise<void>>();
  std::future<void> joined = finished->get_future();
  std::thread joiner([thread = std::move(state_->thread), finished]() mutable {
    thread.join();
    finished->set_value();
  });
  if (joined.wait_for(kStoreReplyLimit) == std::future_status::ready) {
    joiner.join();
  } else {
    joiner.detach();
  }
}

std::string LostReport::seen() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->seen;
}

void LostReport::Publish(::c10d::Store& store, const std::string& report) {
  store.set(kReportKey, std::vector<uint8_t>(report.begin(), report.end()));
}

std::string PeerCheck::Describe(const std::string& failure) const {
  auto host_of = [&](int r) {
    return r >= 0 && r < static_cast<int>(hosts.size()) ? HostName(hosts[r]) : "?";
  };
  // The store's client connection is not safe for concurrent use; both
  // lanes of a group may fail at once.
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  std::vector<int> missing, running;
  // Every store request below runs under RunWithin: the lists are filled
  // only if they all answered.
  struct Found {
    std::vector<int> missing, running;
  };
  auto found = std::make_shared<Found>();
  // Once a request was left unanswered, its thread may still be inside the
  // store's client; no later diagnosis (another lane's) uses it again.
  static std::atomic<bool> store_unanswered{false};
  const bool answered = !store_unanswered && RunWithin(wait + kStoreReplyLimit, [check = *this, found] {
    const auto& store = check.store;
    const auto& group_ranks = check.group_ranks;
    const int world_rank = check.world_rank;
    const auto& report = check.report;
    std::vector<int> missing, running;
    store->set(AliveKey(world_rank), std::vector<uint8_t>{'1'});
    std::vector<int64_t> beats;
    for (int r : group_ranks) beats.push_back(report ? store->add(LostReport::HeartbeatKey(r), 0) : 0);
    const auto deadline = std::chrono::steady_clock::now() + check.wait;
    while (true) {
      missing.clear();
      for (int r : group_ranks) {
        if (r != world_rank && !store->check({AliveKey(r)})) missing.push_back(r);
      }
      if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Of those that did not answer, the ones whose heartbeat went on are
    // still running (blocked in a collective with a lost peer, say).
    if (report) {
      std::vector<int> lost;
      for (int r : missing) {
        size_t i = 0;
        while (group_ranks[i] != r) ++i;
        (store->add(LostReport::HeartbeatKey(r), 0) > beats[i] ? running : lost).push_back(r);
      }
      missing = lost;
    }
    found->missing = std::move(missing);
    found->running = std::move(running);
  });
  if (answered) {
    missing = found->missing;
    running = found->running;
  } else {
    store_unanswered = true;
    const std::string before = report ? report->seen() : "";
    return "the rendezvous store (served by rank 0 on host '" + host_of(0) +
           "') does not answer either: rank 0 exited or this host lost the "
           "network" + (before.empty() ? "" : "; before that, " + before);
  }
  auto list = [&](const std::vector<int>& ranks) {
    std::ostringstream s;
    for (size_t i = 0; i < ranks.size(); ++i) {
      s << (i ? ", " : "") << "rank " << ranks[i] << " (host '" << host_of(ranks[i]) << "')";
    }
    return s.str();
  };
  if (missing.empty() && running.empty()) return "every rank of the group is still alive";
  std::ostringstream s;
  if (!missing.empty()) {
    s << "lost: " << list(missing) << ", which did not answer through the rendezvous store within "
      << std::chrono::duration_cast<std::chrono::seconds>(wait).count()
      << " s (it exited or cannot be reached)";
  }
  if (!running.empty()) {
    s << (missing.empty() ? "" : "; ") << "still running but not answering (inside a collective): "
      << list(running);
  }
  if (missing.empty()) return s.str();
  // The cause, kept short: it travels into every other rank's error.
  constexpr size_t kMaxCause = 240;
  const std::string cause =
      failure.size() > kMaxCause ? failure.substr(0, kMaxCause) + "..." : failure;
  const std::string published =
      "rank " + std::to_string(world_rank) + " (" + cause + ") found " + s.str();
  if (!store_unanswered && RunWithin(kStoreReplyLimit, [store = store, published] {
        LostReport::Publish(*store, published);
      })) {
    // Long enough for every watcher to read it: this rank may serve the
    // store and exit next.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  return s.str();
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
