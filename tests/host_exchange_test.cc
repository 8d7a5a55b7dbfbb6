// The rendezvous's host exchange (core/comm/internal/host_exchange.h), with
// one thread per rank and its own store client, as separate processes
// would have: every rank gets every rank's host in rank order, in the store
// requests the design promises, and a rank that never arrives, or arrives
// twice, is named.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/internal/c10d.h"
#include "core/comm/internal/host_exchange.h"
#include "core/common/error.h"

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

using std::chrono::milliseconds;

// A store server on a free port, and a client of it per rank (rank 0 uses
// the server's own, as World does).
struct TcpStores {
  explicit TcpStores(int world) {
    ::c10d::TCPStoreOptions o;
    o.port = 0;
    o.isServer = true;
    o.waitWorkers = false;
    o.timeout = std::chrono::seconds(30);
    server = c10::make_intrusive<::c10d::TCPStore>("127.0.0.1", o);
    o.isServer = false;
    o.port = server->getPort();
    stores.resize(world);
    stores[0] = server;
    // Connected side by side: LibTorch's client now and then takes 5 s to
    // connect here, and one after another those would add up.
    std::vector<std::thread> connecting;
    for (int r = 1; r < world; ++r) {
      connecting.emplace_back([this, r, o] {
        stores[r] = c10::make_intrusive<::c10d::TCPStore>("127.0.0.1", o);
      });
    }
    for (auto& t : connecting) t.join();
  }
  c10::intrusive_ptr<::c10d::TCPStore> server;
  std::vector<c10::intrusive_ptr<::c10d::Store>> stores;
};

// Four ranks a host: "node<r / 4>/boot".
std::string Identity(int rank) { return "node" + std::to_string(rank / 4) + "/boot"; }

// Runs ExchangeHosts on `ranks` (one thread each); what each returned, or
// its error message as the only element.
std::vector<std::vector<std::string>> Exchange(
    const std::vector<c10::intrusive_ptr<::c10d::Store>>& stores, const std::vector<int>& ranks,
    int world, milliseconds timeout) {
  std::vector<std::vector<std::string>> got(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        got[i] = ExchangeHosts(*stores[i], ranks[i], world, Identity(ranks[i]), timeout);
      } catch (const std::exception& e) {
        got[i] = {std::string("error: ") + e.what()};
      }
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

TEST(HostExchange, SixtyFourRanksGetEveryHostInRankOrder) {
  const int world = 64;
  TcpStores tcp(world);
  std::vector<int> ranks;
  for (int r = world - 1; r >= 0; --r) ranks.push_back(r);  // arrival order reversed
  std::vector<c10::intrusive_ptr<::c10d::Store>> stores(tcp.stores.rbegin(), tcp.stores.rend());
  std::vector<std::string> want;
  for (int r = 0; r < world; ++r) want.push_back(Identity(r));
  for (const auto& got : Exchange(stores, ranks, world, std::chrono::seconds(20))) {
    EXPECT_EQ(got, want);
  }
}

// A store that forwards every call to `inner` and counts it in `requests`
// (as bench/store_scale_bench.cc does).
class CountingStore : public ::c10d::Store {
 public:
  CountingStore(c10::intrusive_ptr<::c10d::Store> inner, std::atomic<int>* requests)
      : inner_(std::move(inner)), requests_(requests) {}
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
    return inner_->get(key);
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
    return inner_->multiGet(keys);
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override {
    ++*requests_;
    inner_->multiSet(keys, values);
  }
  void queuePush(const std::string& key, const std::vector<uint8_t>& value) override {
    ++*requests_;
    inner_->queuePush(key, value);
  }
  std::vector<uint8_t> queuePop(const std::string& key, bool block) override {
    ++*requests_;
    return inner_->queuePop(key, block);
  }
  int64_t queueLen(const std::string& key) override {
    ++*requests_;
    return inner_->queueLen(key);
  }
  std::vector<std::string> listKeys() override {
    ++*requests_;
    return inner_->listKeys();
  }
  bool hasExtendedApi() const override { return inner_->hasExtendedApi(); }

 private:
  c10::intrusive_ptr<::c10d::Store> inner_;
  std::atomic<int>* requests_;
};

// The design's promise (host_exchange.h, docs/many-hosts.md): 4 requests a
// rank (an append, a counter, a wait, one read of the table), and 2 more
// (a read of the arrivals, the table's publication) by the one rank that
// counts the last arrival: 4N + 2 in all, never N^2.
TEST(HostExchange, EachRankMakesFourStoreRequests) {
  const int world = 16;
  TcpStores tcp(world);
  std::vector<std::atomic<int>> requests(world);
  std::vector<c10::intrusive_ptr<::c10d::Store>> stores;
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r) {
    requests[r] = 0;
    stores.push_back(c10::make_intrusive<CountingStore>(tcp.stores[r], &requests[r]));
    ranks.push_back(r);
  }
  std::vector<std::string> want;
  for (int r = 0; r < world; ++r) want.push_back(Identity(r));
  for (const auto& got : Exchange(stores, ranks, world, std::chrono::seconds(20))) {
    EXPECT_EQ(got, want);
  }
  int total = 0, above_four = 0, fewest = 1 << 30;
  for (int r = 0; r < world; ++r) {
    const int n = requests[r];
    total += n;
    fewest = std::min(fewest, n);
    if (n > 4) {
      ++above_four;
      EXPECT_LE(n, 6) << "rank " << r << " (the one that counted the last arrival)";
    }
  }
  EXPECT_LE(above_four, 1) << "more than 4 store requests on " << above_four << " ranks";
  EXPECT_LE(total, 4 * world + 2);
  // The wrapper saw them all: no rank exchanges hosts in fewer.
  EXPECT_EQ(fewest, 4);
}

TEST(HostExchange, OverAFileStoreToo) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/host_exchange_file_store";
  std::remove(path.c_str());
  const int world = 6;
  std::vector<c10::intrusive_ptr<::c10d::Store>> stores;
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r) {
    stores.push_back(c10::make_intrusive<::c10d::FileStore>(path, world));
    ranks.push_back(r);
  }
  std::vector<std::string> want;
  for (int r = 0; r < world; ++r) want.push_back(Identity(r));
  for (const auto& got : Exchange(stores, ranks, world, std::chrono::seconds(20))) {
    EXPECT_EQ(got, want);
  }
}

TEST(HostExchange, TheRanksThatNeverArriveAreNamed) {
  TcpStores tcp(5);
  const auto got = Exchange({tcp.stores[0], tcp.stores[1], tcp.stores[3]}, {0, 1, 3}, 5,
                            milliseconds(1000));
  for (const auto& g : got) {
    ASSERT_EQ(g.size(), 1u);
    EXPECT_NE(g[0].find("ranks 2, 4 of 5 did not arrive within 1 s"), std::string::npos) << g[0];
  }
}

TEST(HostExchange, ARankStartedTwiceIsNamedAtOnce) {
  TcpStores tcp(3);
  const auto start = std::chrono::steady_clock::now();
  const auto got = Exchange(tcp.stores, {0, 1, 1}, 3, std::chrono::seconds(20));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (const auto& g : got) {
    ASSERT_EQ(g.size(), 1u);
    EXPECT_NE(g[0].find("rank 1 arrived twice (two processes started with one RANK?) and "
                        "rank 2 did not"),
              std::string::npos)
        << g[0];
  }
}

}  // namespace
}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
