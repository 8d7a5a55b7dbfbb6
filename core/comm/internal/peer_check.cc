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
#include "core/comm/internal/store_bytes.h"

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

// Each rank that diagnoses a failure appends "<rank>\n" to the list and
// counts itself in the counter (once per diagnosis: a rank may count more
// than once). The others poll the counter, a small request, and read the
// list only when the count could mean that all of them answered.
const char kAliveList[] = "fsdp2/alive_after_failure/list";
const char kAliveCount[] = "fsdp2/alive_after_failure/count";
const char kReportKey[] = "fsdp2/lost_report";

// The ranks of `ranks` absent from the alive list `list`.
std::vector<int> NotAnswered(const std::vector<uint8_t>& list, const std::vector<int>& ranks) {
  std::vector<bool> answered;
  std::istringstream lines(String(list));
  for (int r; lines >> r;) {
    if (r >= 0) {
      if (answered.size() <= static_cast<size_t>(r)) answered.resize(r + 1);
      answered[r] = true;
    }
  }
  std::vector<int> missing;
  for (int r : ranks) {
    if (static_cast<size_t>(r) >= answered.size() || !answered[r]) missing.push_back(r);
  }
  return missing;
}

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
  c10::intrusive_ptr<::c10d::Store> waker;  // null: the watcher runs on a clock
  int rank = 0;
  std::string seen;
  std::thread thread;
};

std::string LostReport::HeartbeatKey(int rank) {
  return "fsdp2/heartbeat/" + std::to_string(rank);
}

std::string LostReport::WakeKey(int rank) {
  return "fsdp2/wake/" + std::to_string(rank);
}

LostReport::LostReport(c10::intrusive_ptr<::c10d::Store> store, int rank,
                       std::chrono::milliseconds period,
                       c10::intrusive_ptr<::c10d::Store> waker)
    : state_(std::make_shared<State>()) {
  state_->waker = std::move(waker);
  state_->rank = rank;
  state_->thread = std::thread([state = state_, store, rank, period] {
    const bool woken_by_store = static_cast<bool>(state->waker);
    while (true) {
      std::string report;
      try {
        store->add(HeartbeatKey(rank), 1);
        if (store->check({kReportKey})) report = String(store->get(kReportKey));
      } catch (const std::exception&) {
        return;  // the store is gone: keep what was seen
      }
      std::unique_lock<std::mutex> lock(state->mu);
      if (!report.empty()) state->seen = report;
      if (!woken_by_store) {
        if (state->stop_cv.wait_for(lock, period, [&] { return state->stop; })) return;
        continue;
      }
      if (state->stop) return;
      lock.unlock();
      try {
        store->wait({WakeKey(rank)}, period);
        // A wake set after this delete finds the next wait; one set before
        // it is answered by the beat and the read that follow.
        store->deleteKey(WakeKey(rank));
      } catch (const std::exception&) {
        // The wait timed out (it is renewed), or the store is gone (the
        // next request says so).
      }
      lock.lock();
      if (state->stop) return;
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
  // A watcher woken by the store is blocked in a wait until its wake key
  // is set. Where the store does not answer, it is stuck in a request (see
  // RunWithin) and is left, owning its state and store.
  if (state_->waker &&
      !RunWithin(kStoreReplyLimit, [waker = state_->waker, rank = state_->rank] {
        waker->set(WakeKey(rank), Bytes("1"));
      })) {
    state_->thread.detach();
    return;
  }
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

void LostReport::Publish(::c10d::Store& store, const std::string& report, int world) {
  // The first report stands: the ranks that diagnose one failure at once
  // wake the world once, not once each.
  if (store.compareSet(kReportKey, {}, Bytes(report)) != Bytes(report)) return;
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(WakeKey(r));
  store.multiSet(keys, std::vector<std::vector<uint8_t>>(keys.size(), Bytes("1")));
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
  auto diagnose = [check = *this, found] {
    const auto& store = check.store;
    const auto& group_ranks = check.group_ranks;
    const int world_rank = check.world_rank;
    const auto& report = check.report;
    std::vector<int> missing, running;
    store->append(kAliveList, Bytes(std::to_string(world_rank) + "\n"));
    store->add(kAliveCount, 1);
    std::vector<int> others;
    for (int r : group_ranks) {
      if (r != world_rank) others.push_back(r);
    }
    // One small request a poll; the list (a few bytes a rank) is read when
    // the count has changed and is large enough for all `others` to be in
    // it, halfway (when the watchers of those not in it are woken to beat;
    // `beats`: their count before) and at the deadline.
    const auto start = std::chrono::steady_clock::now();
    const auto halfway = start + check.wait / 2, deadline = start + check.wait;
    std::vector<std::pair<int, int64_t>> beats;
    bool woken = false;
    int64_t count_read = -1;
    while (true) {
      const int64_t count = store->add(kAliveCount, 0);
      if (count != count_read && count >= static_cast<int64_t>(others.size())) {
        count_read = count;
        missing = NotAnswered(store->get(kAliveList), others);
        if (missing.empty()) break;
      }
      const auto now = std::chrono::steady_clock::now();
      if (report && !woken && now >= halfway) {
        woken = true;
        std::vector<std::string> wake;
        for (int r : NotAnswered(store->get(kAliveList), others)) {
          beats.emplace_back(r, store->add(LostReport::HeartbeatKey(r), 0));
          wake.push_back(LostReport::WakeKey(r));
        }
        if (!wake.empty()) {
          store->multiSet(wake, std::vector<std::vector<uint8_t>>(wake.size(), Bytes("1")));
        }
      }
      if (now >= deadline) {
        missing = NotAnswered(store->get(kAliveList), others);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Of those that did not answer, the ones whose watcher beat when woken
    // are still running (blocked in a collective with a lost peer, say).
    if (report) {
      std::vector<int> lost;
      for (int r : missing) {
        bool beat = false;
        for (const auto& [woken_rank, before] : beats) {
          if (woken_rank == r) beat = store->add(LostReport::HeartbeatKey(r), 0) > before;
        }
        (beat ? running : lost).push_back(r);
      }
      missing = lost;
    }
    found->missing = std::move(missing);
    found->running = std::move(running);
  };
  const bool answered = !store_unanswered && RunWithin(wait + kStoreReplyLimit, diagnose);
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
  auto publish = [store = store, published, world = hosts.size()] {
    LostReport::Publish(*store, published, static_cast<int>(world));
  };
  if (!store_unanswered && RunWithin(kStoreReplyLimit, publish)) {
    // Long enough for every watcher to read it: this rank may serve the
    // store and exit next.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  return s.str();
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
