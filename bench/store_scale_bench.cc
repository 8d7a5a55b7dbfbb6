// Start-up and liveness traffic through the rendezvous store as the world
// grows (issue #30): one TCPStore server, one thread per simulated rank
// with its own client connection, as in a job where every rank is a
// process on its own host. For the host exchange of the rendezvous, before
// #30 (every rank polls `check` over all N keys every 50 ms, then gets each:
// N^2 requests) and now (core/comm/internal/host_exchange.h: 4 requests a
// rank), it prints the time until every rank has the table and the requests
// the server handled; for the liveness watchers, before (each rank counts
// its heartbeat and checks for a report every second) and now (watchers
// woken through the store, internal/peer_check.h), the server's request
// rate while idle, measured over --window-s and as designed (2 a rank a
// second before; 3 a rank per renewal of the wait now, once a day:
// LostReport::kWokenRenewal).
//
// Requests are counted on the client side: every simulated rank's store is
// wrapped in a CountingStore that adds one per call (a multi-key call is
// one request, as it is one message to the server) and the bytes of the
// values it read (what the server sent, less framing).
//
//   bazel run -c opt //bench:store_scale -- --ranks 64,256,1024,4096
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/internal/c10d.h"
#include "core/comm/internal/host_exchange.h"
#include "core/comm/internal/peer_check.h"
#include "examples/flags/flags.h"

namespace fsdp2 {
namespace {

using Clock = std::chrono::steady_clock;
using StorePtr = c10::intrusive_ptr<::c10d::Store>;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A store that forwards every call to `inner` and counts it in `requests`.
class CountingStore : public ::c10d::Store {
 public:
  CountingStore(StorePtr inner, std::atomic<int64_t>* requests, std::atomic<int64_t>* bytes_read)
      : inner_(std::move(inner)), requests_(requests), bytes_read_(bytes_read) {}
  c10::intrusive_ptr<Store> clone() override { return inner_->clone(); }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    ++*requests_;
    inner_->set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                  const std::vector<uint8_t>& value) override {
    ++*requests_;
    return inner_->compareSet(key, current, value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    ++*requests_;
    auto value = inner_->get(key);
    *bytes_read_ += static_cast<int64_t>(value.size());
    return value;
  }
  int64_t add(const std::string& key, int64_t value) override {
    ++*requests_;
    return inner_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    ++*requests_;
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    ++*requests_;
    return inner_->check(keys);
  }
  int64_t getNumKeys() override {
    ++*requests_;
    return inner_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override {
    ++*requests_;
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    ++*requests_;
    inner_->wait(keys, t);
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    ++*requests_;
    inner_->append(key, value);
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    ++*requests_;
    auto values = inner_->multiGet(keys);
    for (const auto& v : values) *bytes_read_ += static_cast<int64_t>(v.size());
    return values;
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override {
    ++*requests_;
    inner_->multiSet(keys, values);
  }
  bool hasExtendedApi() const override { return inner_->hasExtendedApi(); }

 private:
  StorePtr inner_;
  std::atomic<int64_t>* requests_;
  std::atomic<int64_t>* bytes_read_;
};

// The host exchange as core/comm/world.cc did it before #30.
std::vector<std::string> ExchangeHostsBefore(::c10d::Store& store, int rank, int world,
                                             const std::string& identity) {
  auto key = [](int k) { return "fsdp2/host/" + std::to_string(k); };
  store.set(key(rank), std::vector<uint8_t>(identity.begin(), identity.end()));
  std::vector<std::string> keys;
  for (int k = 0; k < world; ++k) keys.push_back(key(k));
  while (!store.check(keys)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<std::string> hosts;
  for (const auto& k : keys) {
    auto v = store.get(k);
    hosts.emplace_back(v.begin(), v.end());
  }
  return hosts;
}

// Eight ranks a simulated host, each with a boot id as long as a real one.
std::string Identity(int rank) {
  return "simhost" + std::to_string(rank / 8) + "/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
}

// A server and `n` counted clients of it (rank 0's is the server's own, as
// in World), plus one more connection for the watchers' wakes.
struct Cluster {
  explicit Cluster(int n) {
    ::c10d::TCPStoreOptions o;
    o.port = 0;
    o.isServer = true;
    o.waitWorkers = false;
    o.timeout = std::chrono::minutes(10);
    server = c10::make_intrusive<::c10d::TCPStore>("127.0.0.1", o);
    o.isServer = false;
    o.port = server->getPort();
    clients.resize(n);
    clients[0] = c10::make_intrusive<CountingStore>(server, &requests, &bytes_read);
    // Connected side by side: LibTorch's client now and then takes 5 s to
    // connect on this machine, and one after another those would add up.
    const int connectors = std::min(n, 128);
    std::vector<std::thread> connecting;
    for (int k = 0; k < connectors; ++k) {
      connecting.emplace_back([this, k, n, connectors, o] {
        for (int r = 1 + k; r < n; r += connectors) {
          clients[r] = c10::make_intrusive<CountingStore>(
              c10::make_intrusive<::c10d::TCPStore>("127.0.0.1", o), &requests, &bytes_read);
        }
      });
    }
    for (auto& t : connecting) t.join();
    waker = c10::make_intrusive<CountingStore>(
        c10::make_intrusive<::c10d::TCPStore>("127.0.0.1", o), &requests, &bytes_read);
  }
  std::atomic<int64_t> requests{0}, bytes_read{0};  // values read by get and multiGet
  c10::intrusive_ptr<::c10d::TCPStore> server;
  std::vector<StorePtr> clients;
  StorePtr waker;
};

// Every rank runs `exchange` at once; the seconds until the last is done.
template <typename Exchange>
double TimeExchange(Cluster& c, Exchange exchange) {
  const int n = static_cast<int>(c.clients.size());
  std::mutex mu;
  std::condition_variable go_cv;
  bool go = false;
  std::atomic<int> wrong{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      {
        std::unique_lock<std::mutex> lock(mu);
        go_cv.wait(lock, [&] { return go; });
      }
      auto hosts = exchange(*c.clients[r], r, n, Identity(r));
      if (hosts.size() != static_cast<size_t>(n) || hosts[n - 1] != Identity(n - 1)) ++wrong;
    });
  }
  const auto start = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  go_cv.notify_all();
  for (auto& t : ranks) t.join();
  const double took = Seconds(Clock::now() - start);
  if (wrong > 0) {
    throw std::runtime_error(std::to_string(wrong.load()) + " ranks got a wrong table");
  }
  return took;
}

// The watchers before #30: each rank, every second, counts its heartbeat up
// and checks for a report. Requests per second at the server over `window`.
double HeartbeatRateBefore(Cluster& c, std::chrono::milliseconds window) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> ranks;
  for (int r = 0; r < static_cast<int>(c.clients.size()); ++r) {
    ranks.emplace_back([&, r] {
      // Spread over the second, as ranks that started at different times.
      std::this_thread::sleep_for(std::chrono::milliseconds(r * 997 % 1000));
      while (!stop) {
        c.clients[r]->add(comm::internal::LostReport::HeartbeatKey(r), 1);
        c.clients[r]->check({"fsdp2/lost_report"});
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // all started
  const int64_t before = c.requests;
  std::this_thread::sleep_for(window);
  const double rate = (c.requests - before) / Seconds(window);
  stop = true;
  for (auto& t : ranks) t.join();
  return rate;
}

// The watchers now, with World's period for `n` ranks: requests per second
// at the server over `window`, once all have started.
double HeartbeatRateNow(Cluster& c, std::chrono::milliseconds window) {
  const int n = static_cast<int>(c.clients.size());
  const auto period = comm::internal::LostReport::kWokenRenewal;
  std::vector<std::unique_ptr<comm::internal::LostReport>> watchers;
  for (int r = 0; r < n; ++r) {
    watchers.push_back(std::make_unique<comm::internal::LostReport>(
        c.clients[r], r, std::chrono::duration_cast<std::chrono::milliseconds>(period), c.waker));
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // all started
  const int64_t before = c.requests;
  std::this_thread::sleep_for(window);
  const double rate = (c.requests - before) / Seconds(window);
  watchers.clear();
  return rate;
}

// Raises the soft limit on open files to the hard one: each simulated rank
// holds a client socket and the server its end of it.
void RaiseOpenFiles(int ranks) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  const rlim_t need = 2 * static_cast<rlim_t>(ranks) + 256;
  if (limit.rlim_cur < need) {
    limit.rlim_cur = std::min(need, limit.rlim_max);
    setrlimit(RLIMIT_NOFILE, &limit);
    std::printf("open files: soft limit raised to %llu (for %d ranks)\n",
                static_cast<unsigned long long>(limit.rlim_cur), ranks);
  }
  if (limit.rlim_cur < need) {
    throw std::runtime_error("open files: " + std::to_string(need) + " needed, hard limit " +
                             std::to_string(limit.rlim_max) + " (raise it with ulimit -Hn)");
  }
}

int Run(const std::vector<int64_t>& ranks, const std::string& protocol, double budget_s,
        double window_s) {
  RaiseOpenFiles(static_cast<int>(*std::max_element(ranks.begin(), ranks.end())));
  const bool before = protocol != "now", now = protocol != "before";
  const auto window = std::chrono::milliseconds(static_cast<int64_t>(window_s * 1000));
  std::printf("%6s  %-8s %26s %10s %9s %15s %15s\n", "ranks", "protocol", "exchange",
              "requests", "MiB read", "heartbeat req/s", "(by design)");
  double before_per_n2 = 0;  // seconds / N^2 of the largest exchange before #30
  for (int64_t n64 : ranks) {
    const int n = static_cast<int>(n64);
    Cluster c(n);  // both protocols use it: their keys differ
    if (before) {
      const double estimate = before_per_n2 * n * n;
      char exchange[64];
      int64_t requests = -1;
      double mib = -1;
      if (estimate > budget_s) {
        std::snprintf(exchange, sizeof(exchange), "skipped (N^2: est. %.0f s)", estimate);
      } else {
        const int64_t r0 = c.requests, b0 = c.bytes_read;
        const double s = TimeExchange(c, ExchangeHostsBefore);
        requests = c.requests - r0;
        mib = (c.bytes_read - b0) / 1048576.0;
        before_per_n2 = s / (static_cast<double>(n) * n);
        std::snprintf(exchange, sizeof(exchange), "%.3f s", s);
      }
      const double beats = HeartbeatRateBefore(c, window);
      char mib_read[32] = "-";
      if (mib >= 0) std::snprintf(mib_read, sizeof(mib_read), "%.1f", mib);
      std::printf("%6d  %-8s %26s %10s %9s %15.0f %15.0f\n", n, "before", exchange,
                  requests < 0 ? "-" : std::to_string(requests).c_str(), mib_read, beats, 2.0 * n);
    }
    if (now) {
      const int64_t r0 = c.requests, b0 = c.bytes_read;
      const double s = TimeExchange(c, [](::c10d::Store& store, int rank, int world,
                                          const std::string& identity) {
        return comm::internal::ExchangeHosts(store, rank, world, identity,
                                             std::chrono::minutes(10));
      });
      const int64_t requests = c.requests - r0;
      const double mib = (c.bytes_read - b0) / 1048576.0;
      const double beats = HeartbeatRateNow(c, window);
      char exchange[32];
      std::snprintf(exchange, sizeof(exchange), "%.3f s", s);
      const double renewal_s =
          std::chrono::duration<double>(comm::internal::LostReport::kWokenRenewal).count();
      std::printf("%6d  %-8s %26s %10lld %9.1f %15.1f %15.3f\n", n, "now", exchange,
                  static_cast<long long>(requests), mib, beats, 3.0 * n / renewal_s);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace fsdp2

int main(int argc, char** argv) {
  using namespace fsdp2;
  std::vector<int64_t> ranks{64, 256, 1024, 4096};
  std::string protocol = "both";
  double budget_s = 40, window_s = 5;
  try {
    flags::Flags flags(argc, argv,
                       "usage: bazel run -c opt //bench:store_scale -- [--flag value ...]\n");
    ranks = flags.IntList("ranks", ranks, "simulated world sizes, one thread and client each");
    protocol = flags.String("protocol", protocol, "before, now or both (before/after #30)");
    budget_s = flags.Double("budget-s", budget_s,
                            "skip the quadratic exchange where its estimate exceeds this");
    window_s = flags.Double("window-s", window_s, "seconds over which heartbeats are counted");
    flags.Finish();
  } catch (const flags::FlagError& e) {
    std::cerr << "store_scale: " << e.what() << "\n";
    return 2;
  }
  try {
    return Run(ranks, protocol, budget_s, window_s);
  } catch (const std::exception& e) {
    std::cerr << "store_scale: " << e.what() << "\n";
    return 1;
  }
}
