// The rendezvous's host exchange (core/comm/internal/host_exchange.h), with
// one thread per rank and its own store client, as separate processes
// would have: every rank gets every rank's host in rank order, and a rank
// that never arrives, or arrives twice, is named.
#include <gtest/gtest.h>

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
