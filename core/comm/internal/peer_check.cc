#include "core/comm/internal/peer_check.h"

#include <atomic>
#include <condition_variable>
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
  if (state_->thread.joinable()) state_->thread.join();
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
  try {
    store->set(AliveKey(world_rank), std::vector<uint8_t>{'1'});
    std::vector<int64_t> beats;
    for (int r : group_ranks) beats.push_back(report ? store->add(LostReport::HeartbeatKey(r), 0) : 0);
    const auto deadline = std::chrono::steady_clock::now() + wait;
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
  } catch (const std::exception&) {
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
  try {
    // The cause, kept short: it travels into every other rank's error.
    constexpr size_t kMaxCause = 240;
    std::string cause = failure.size() > kMaxCause ? failure.substr(0, kMaxCause) + "..." : failure;
    LostReport::Publish(*store, "rank " + std::to_string(world_rank) + " (" + cause + ") found " +
                                    s.str());
    // Long enough for every watcher to read it: this rank may serve the
    // store and exit next.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  } catch (const std::exception&) {
  }
  return s.str();
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
