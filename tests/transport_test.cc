// Each transport of core/comm driven directly, without ProcessGroup, on 1-3
// real processes: GlooTransport, ShmTransport (over a fallback that refuses
// everything, so each collective provably went through shared memory, and
// with slots of a few bytes, so every collective crosses many segments),
// SingleRankTransport, the shared-memory segment's peer-exit detection, and
// ConnectTransport's choice among them.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm/internal/c10d.h"
#include "core/comm/internal/connect_transport.h"
#include "core/comm/internal/gloo_transport.h"
#include "core/comm/internal/shm_segment.h"
#include "core/comm/internal/shm_transport.h"
#include "core/comm/internal/single_rank_transport.h"
#include "tests/harness/multi_process.h"

namespace fsdp2 {
namespace testing {
namespace {

using comm::Piece;
using comm::ReduceOp;
using comm::ReduceScatterAlgorithm;
using comm::internal::Transport;

constexpr std::chrono::milliseconds kTimeout = std::chrono::seconds(60);

void Check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

// rank r contributes r * 10 + [0, n): small integers, so sums are exact in
// every dtype tested (bfloat16 included) whatever the summation order.
at::Tensor Contribution(int rank, int64_t n, at::ScalarType dtype) {
  return (at::arange(n, at::kDouble) + rank * 10.0).to(dtype);
}

at::Tensor SumOfContributions(int world, int64_t n, at::ScalarType dtype) {
  at::Tensor sum = at::zeros({n}, dtype);
  for (int k = 0; k < world; ++k) sum += Contribution(k, n, dtype);
  return sum;
}

// Every collective of `t` against its definition, with `n` elements per
// rank (sizes that do not divide by the world size included), reducing
// with each of `algorithms`.
void CheckCollectives(Transport& t, at::ScalarType dtype, int64_t n,
                      const std::vector<ReduceScatterAlgorithm>& algorithms) {
  const int W = t.world(), r = t.rank();
  const std::string where = " (" + std::string(c10::toString(dtype)) + ", " +
                            std::to_string(n) + " per rank)";
  at::Tensor out = at::empty({W * n}, dtype);
  t.all_gather_into_flat(out, Contribution(r, n, dtype));
  for (int k = 0; k < W; ++k) {
    Check(out.narrow(0, k * n, n).equal(Contribution(k, n, dtype)),
          "all_gather_into_flat chunk " + std::to_string(k) + where);
  }
  // Pieces of 3, 0 and n elements per rank; each rank fills only its own.
  const std::vector<Piece> pieces{{0, 3}, {3, 0}, {3, n}};
  at::Tensor buffer = at::full({W * (3 + n)}, -1.0, at::kDouble).to(dtype);
  for (const auto& p : pieces) {
    buffer.narrow(0, W * p.offset + r * p.numel, p.numel)
        .copy_(Contribution(r, p.numel, dtype) + p.offset);
  }
  t.all_gather_pieces(buffer, pieces);
  for (const auto& p : pieces) {
    for (int k = 0; k < W; ++k) {
      Check(buffer.narrow(0, W * p.offset + k * p.numel, p.numel)
                .equal(Contribution(k, p.numel, dtype) + p.offset),
            "all_gather_pieces part " + std::to_string(k) + where);
    }
  }
  const at::Tensor sum = SumOfContributions(W, W * n, dtype);
  for (auto algorithm : algorithms) {
    at::Tensor slice = at::empty({n}, dtype);
    t.reduce_scatter_flat(slice, Contribution(r, W * n, dtype), algorithm);
    Check(slice.equal(sum.narrow(0, r * n, n)),
          "reduce_scatter_flat algorithm " +
              std::to_string(static_cast<int>(algorithm)) + where);
    // In place: the output is this rank's own slice of the input (the
    // engine's gradient reduction).
    at::Tensor input = Contribution(r, W * n, dtype);
    at::Tensor own = input.narrow(0, r * n, n);
    t.reduce_scatter_flat(own, input, algorithm);
    Check(own.equal(sum.narrow(0, r * n, n)),
          "reduce_scatter_flat in place, algorithm " +
              std::to_string(static_cast<int>(algorithm)) + where);
  }
  at::Tensor reduced = Contribution(r, n, dtype).view({1, n});
  t.all_reduce(reduced, ReduceOp::kSum);
  Check(reduced.view(-1).equal(sum.narrow(0, 0, n)), "all_reduce sum" + where);
  at::Tensor largest = Contribution(r, n, dtype);
  t.all_reduce(largest, ReduceOp::kMax);
  Check(largest.equal(Contribution(W - 1, n, dtype)), "all_reduce max" + where);
  for (int root : {0, W - 1}) {
    at::Tensor b = Contribution(r, n, dtype);
    t.broadcast(b, root);
    Check(b.equal(Contribution(root, n, dtype)),
          "broadcast from " + std::to_string(root) + where);
  }
  t.barrier();
}

// `scenario` on `world_size` ranks, each given `args`.
LaunchOptions Ranks(int world_size, const std::string& scenario,
                    std::vector<std::string> args = {}) {
  LaunchOptions o;
  o.world_size = world_size;
  o.scenario = scenario;
  o.args = std::move(args);
  o.timeout = std::chrono::seconds(120);
  return o;
}

int Rank() { return std::atoi(std::getenv("RANK")); }
int WorldSize() { return std::atoi(std::getenv("WORLD_SIZE")); }

// The rendezvous store the harness gives this rank, under `prefix`. One
// FileStore per process: the last of the ranks' instances to go deletes
// the file.
c10::intrusive_ptr<::c10d::Store> RankStore(const std::string& prefix) {
  static const auto file = [] {
    auto store = c10::make_intrusive<::c10d::FileStore>(
        std::getenv("FSDP2_STORE_PATH"), WorldSize());
    store->setTimeout(kTimeout);
    return store;
  }();
  return c10::make_intrusive<::c10d::PrefixStore>(prefix, file);
}

std::unique_ptr<comm::internal::GlooTransport> ConnectGloo() {
  return comm::internal::GlooTransport::Connect(
      RankStore("gloo"), Rank(), WorldSize(),
      comm::internal::GlooDeviceForAddress("127.0.0.1"), kTimeout);
}

FSDP2_SCENARIO(gloo_transport) {
  auto gloo = ConnectGloo();
  const std::vector<ReduceScatterAlgorithm> all{
      ReduceScatterAlgorithm::kAuto, ReduceScatterAlgorithm::kRing,
      ReduceScatterAlgorithm::kAllReduce};
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    CheckCollectives(*gloo, dtype, 5, all);
  }
  // The ring reduce-scatter moves its chunks in 1 MiB segments: 300000
  // floats per rank take two.
  CheckCollectives(*gloo, at::kFloat, 300000, all);
}

TEST(GlooTransport, CollectivesMatchTheirDefinition) {
  for (int n : {2, 3}) {
    auto r = LaunchRanks(Ranks(n, "gloo_transport"));
    EXPECT_TRUE(r.ok()) << "world " << n << "\n" << r.Describe();
  }
}

// A fallback that refuses every call: what reaches it did not go through
// shared memory.
class RefusingTransport final : public Transport {
 public:
  RefusingTransport(int rank, int world) : Transport(rank, world) {}
  const char* kind() const override { return "refusing"; }
  void all_gather_into_flat(const at::Tensor&, const at::Tensor&) override {
    Refuse("all_gather_into_flat");
  }
  void all_gather_pieces(const at::Tensor&, const std::vector<Piece>&) override {
    Refuse("all_gather_pieces");
  }
  void reduce_scatter_flat(const at::Tensor&, const at::Tensor&,
                           ReduceScatterAlgorithm) override {
    Refuse("reduce_scatter_flat");
  }
  void all_reduce(const at::Tensor&, ReduceOp) override { Refuse("all_reduce"); }
  void broadcast(const at::Tensor&, int) override { Refuse("broadcast"); }
  void barrier() override { Refuse("barrier"); }

 private:
  [[noreturn]] static void Refuse(const std::string& op) {
    throw std::logic_error("the fallback was asked for " + op);
  }
};

// Slots of 2 MiB, as groups get them: one segment per collective here; and
// of 24 bytes: a few elements per segment, pieces split across segments.
FSDP2_SCENARIO(shm_transport) {
  for (size_t slot_bytes : {size_t{2} << 20, size_t{24}}) {
    auto segment = comm::internal::ShmSegment::Create(
        *RankStore("shm/" + std::to_string(slot_bytes)), Rank(), WorldSize(),
        slot_bytes, kTimeout);
    Check(segment != nullptr, "the segment was created");
    comm::internal::ShmTransport shm(
        std::move(segment),
        std::make_unique<RefusingTransport>(Rank(), WorldSize()));
    for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
      // 16-bit floats hold the sums of larger contributions inexactly.
      const bool wide = dtype == at::kFloat || dtype == at::kDouble;
      for (int64_t n : {1, 5, wide ? 64 : 6}) {
        CheckCollectives(shm, dtype, n, {ReduceScatterAlgorithm::kAuto});
      }
    }
    // A reduce-scatter that names an algorithm is the backend's to run.
    at::Tensor slice = at::empty({2});
    try {
      shm.reduce_scatter_flat(slice, at::ones({2 * WorldSize()}),
                              ReduceScatterAlgorithm::kRing);
      Check(false, "kRing went to the fallback");
    } catch (const std::logic_error& e) {
      Check(std::string(e.what()) ==
                "the fallback was asked for reduce_scatter_flat",
            std::string("kRing went to the fallback, not: ") + e.what());
    }
    shm.barrier();
  }
}

TEST(ShmTransport, CollectivesMatchTheirDefinition) {
  for (int n : {2, 3}) {
    auto r = LaunchRanks(Ranks(n, "shm_transport"));
    EXPECT_TRUE(r.ok()) << "world " << n << "\n" << r.Describe();
  }
}

// args[0]: how rank 1's collective differs from rank 0's all-reduce of 4
// floats. Every rank must fail naming both, never mix the buffers.
FSDP2_SCENARIO(shm_mismatch) {
  auto segment = comm::internal::ShmSegment::Create(
      *RankStore("shm"), Rank(), WorldSize(), 64, kTimeout);
  Check(segment != nullptr, "the segment was created");
  comm::internal::ShmTransport shm(
      std::move(segment), std::make_unique<RefusingTransport>(Rank(), WorldSize()));
  const std::string how = args.at(0);
  at::Tensor t = at::ones({4});
  try {
    if (Rank() == 0 || how == "none") {
      shm.all_reduce(t, ReduceOp::kSum);
    } else if (how == "size") {
      at::Tensor u = at::ones({6});
      shm.all_reduce(u, ReduceOp::kSum);
    } else if (how == "empty") {
      at::Tensor u = at::ones({0});
      shm.all_reduce(u, ReduceOp::kSum);
    } else if (how == "dtype") {
      at::Tensor u = at::ones({4}, at::kDouble);
      shm.all_reduce(u, ReduceOp::kSum);
    } else if (how == "kind") {
      shm.broadcast(t, 0);
    }
  } catch (const std::exception& e) {
    std::printf("rank %d: %s\n", Rank(), e.what());
    Check(std::string(e.what()).find("shared-memory collectives do not match") !=
              std::string::npos,
          std::string("the mismatch is named: ") + e.what());
    std::fflush(stdout);
    std::_Exit(3);
  }
  Check(t.equal(at::full({4}, 2.0)), "a matching all-reduce sums");
}

TEST(ShmTransport, MismatchedCollectivesFailOnEveryRank) {
  auto ok = LaunchRanks(Ranks(2, "shm_mismatch", {"none"}));
  EXPECT_TRUE(ok.ok()) << ok.Describe();
  for (const char* how : {"size", "empty", "dtype", "kind"}) {
    auto r = LaunchRanks(Ranks(2, "shm_mismatch", {how}));
    ASSERT_EQ(r.ranks.size(), 2u);
    for (const auto& rank : r.ranks) {
      EXPECT_FALSE(rank.timed_out) << how << "\n" << r.Describe();
      EXPECT_EQ(rank.exit_code, 3) << how << "\n" << r.Describe();
      EXPECT_NE(rank.log.find("do not match"), std::string::npos)
          << how << "\n" << r.Describe();
    }
  }
}

FSDP2_SCENARIO(segment_peer_exits) {
  auto segment = comm::internal::ShmSegment::Create(
      *RankStore("shm"), Rank(), WorldSize(), 64, kTimeout);
  Check(segment != nullptr, "the segment was created");
  if (Rank() == 1) std::_Exit(0);  // gone without a word
  segment->sync();
}

// A peer's death closes no socket: the waiting rank must notice the process
// is gone, well before the 60 s timeout (the launch's own limit is 120 s).
TEST(ShmSegment, PeerThatExitsFailsTheBarrier) {
  auto r = LaunchRanks(Ranks(2, "segment_peer_exits"));
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_FALSE(r.ranks[0].timed_out) << "rank 0 hung";
  EXPECT_NE(r.ranks[0].exit_code, 0);
  EXPECT_NE(r.ranks[0].log.find("rank 1 (pid "), std::string::npos)
      << r.Describe();
  EXPECT_NE(r.ranks[0].log.find("exited during a shared-memory collective"),
            std::string::npos)
      << r.Describe();
}

TEST(SingleRankTransport, CollectivesMatchTheirDefinition) {
  comm::internal::SingleRankTransport single;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    EXPECT_NO_THROW(CheckCollectives(single, dtype, 5,
                                     {ReduceScatterAlgorithm::kAuto,
                                      ReduceScatterAlgorithm::kRing,
                                      ReduceScatterAlgorithm::kAllReduce}));
  }
}

// args[0]: the transport every rank must get: "shm" or "gloo".
FSDP2_SCENARIO(connect_transport) {
  comm::internal::TransportOptions options;
  options.store = RankStore("connect");
  options.rank = Rank();
  options.world = WorldSize();
  options.gloo_device =
      comm::internal::GlooDeviceForAddress("127.0.0.1");
  options.timeout = kTimeout;
  std::unique_ptr<Transport> t = comm::internal::ConnectTransport(options);
  const std::string expected = args.at(0);
  // Host transports come wrapped for device tensors (StagedTransport);
  // kind() names the one that carries the bytes.
  Check(std::string(t->kind()) == expected, "a transport of kind " + expected);
  CheckCollectives(*t, at::kFloat, 5,
                   {ReduceScatterAlgorithm::kAuto, ReduceScatterAlgorithm::kRing});
}

TEST(ConnectTransport, SharedMemoryWhenEveryRankIsLocalAndAllowsIt) {
  auto r = LaunchRanks(Ranks(2, "connect_transport", {"shm"}));
  EXPECT_TRUE(r.ok()) << r.Describe();
}

// One rank with FSDP2_SHM=0 puts every rank on Gloo.
TEST(ConnectTransport, GlooOnEveryRankWhenOneRankOptsOut) {
  LaunchOptions o = Ranks(3, "connect_transport", {"gloo"});
  o.rank_env[2]["FSDP2_SHM"] = "0";
  auto r = LaunchRanks(o);
  EXPECT_TRUE(r.ok()) << r.Describe();
}

TEST(ConnectTransport, OneRankNeedsNoCommunicator) {
  comm::internal::TransportOptions options;  // no store, no device: unused
  options.world = 1;
  auto t = comm::internal::ConnectTransport(options);
  EXPECT_NE(dynamic_cast<comm::internal::SingleRankTransport*>(t.get()), nullptr);
}

TEST(ConnectTransport, UnknownBackendIsAnError) {
  // A transport takes a comm::Backend; a name it does not know is refused
  // where it is parsed.
  try {
    comm::ParseBackend("mpi");
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown backend \"mpi\""),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
