// Collectives, meshes and rendezvous errors, on 1-4 real processes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/comm/device_mesh.h"
#include "core/comm/world.h"
#include "tests/harness/multi_process.h"

namespace fsdp2 {
namespace testing {
namespace {

void Check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

// rank r contributes r * 10 + [0, n): small integers, so sums are exact in
// every dtype tested (bfloat16 included) whatever the summation order.
at::Tensor Contribution(int rank, int64_t n, at::ScalarType dtype) {
  return (at::arange(n, at::kDouble) + rank * 10.0).to(dtype);
}

void CheckGroupCollectives(comm::ProcessGroup& g, at::ScalarType dtype) {
  const int W = g.size(), r = g.rank();
  const int64_t n = 4;
  // all-gather: chunk k is rank k's contribution.
  at::Tensor out = at::empty({W * n}, dtype);
  g.all_gather_into_flat(out, Contribution(r, n, dtype)).wait();
  for (int k = 0; k < W; ++k) {
    Check(out.narrow(0, k * n, n).equal(Contribution(k, n, dtype)),
          "all_gather chunk " + std::to_string(k) + " on " + g.name());
  }
  // all-gather in place, piece by piece (FSDP's unsharded layout): pieces of
  // 3, 0 and 5 elements per rank; every rank fills only its own parts.
  {
    const std::vector<comm::ProcessGroup::Piece> pieces{{0, 3}, {3, 0}, {3, 5}};
    at::Tensor buffer = at::full({W * 8}, -1.0, at::kDouble).to(dtype);
    for (const auto& p : pieces) {
      buffer.narrow(0, W * p.offset + r * p.numel, p.numel)
          .copy_(Contribution(r, p.numel, dtype) + p.offset);
    }
    g.all_gather_pieces(buffer, pieces).wait();
    for (const auto& p : pieces) {
      for (int k = 0; k < W; ++k) {
        Check(buffer.narrow(0, W * p.offset + k * p.numel, p.numel)
                  .equal(Contribution(k, p.numel, dtype) + p.offset),
              "all_gather_pieces part " + std::to_string(k) + " on " + g.name());
      }
    }
  }
  // reduce-scatter, both algorithms: slice r of the elementwise sum.
  at::Tensor sum = at::zeros({W * n}, dtype);
  for (int k = 0; k < W; ++k) sum += Contribution(k, W * n, dtype);
  for (auto algo : {comm::ReduceScatterAlgorithm::kRing,
                    comm::ReduceScatterAlgorithm::kAllReduce}) {
    at::Tensor slice = at::empty({n}, dtype);
    g.reduce_scatter_flat(slice, Contribution(r, W * n, dtype),
                          comm::Lane::kGradient, algo)
        .wait();
    Check(slice.equal(sum.narrow(0, r * n, n)), "reduce_scatter on " + g.name());
  }
  at::Tensor t = Contribution(r, n, dtype);
  g.all_reduce(t).wait();
  Check(t.equal(sum.narrow(0, 0, n)), "all_reduce on " + g.name());
  // Any shape is taken element by element; sizes that do not divide by the
  // world size leave some ranks' parts empty.
  at::Tensor t2 = Contribution(r, 6, dtype).view({3, 2});
  g.all_reduce(t2).wait();
  at::Tensor sum6 = at::zeros({6}, dtype);
  for (int k = 0; k < W; ++k) sum6 += Contribution(k, 6, dtype);
  Check(t2.equal(sum6.view({3, 2})), "2-D all_reduce on " + g.name());
  at::Tensor b2 = Contribution(r, 6, dtype).view({2, 3});
  g.broadcast(b2, 0).wait();
  Check(b2.equal(Contribution(0, 6, dtype).view({2, 3})),
        "2-D broadcast on " + g.name());
  at::Tensor m = at::full({1}, double(r), dtype);
  g.all_reduce(m, comm::ReduceOp::kMax).wait();
  Check(m.item<double>() == W - 1, "all_reduce max on " + g.name());
  at::Tensor b = Contribution(r, n, dtype);
  g.broadcast(b, W - 1).wait();
  Check(b.equal(Contribution(W - 1, n, dtype)), "broadcast on " + g.name());
  g.barrier().wait();
}

FSDP2_SCENARIO(collectives) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    CheckGroupCollectives(*world->group(), dtype);
  }
  if (world->size() == 4) {
    auto mesh = comm::DeviceMesh::Create(world, {2, 2}, {"replicate", "shard"});
    const int r = world->rank();
    Check(mesh->local_rank("replicate") == r / 2, "replicate coordinate");
    Check(mesh->local_rank("shard") == r % 2, "shard coordinate");
    Check(mesh->group("shard")->global_ranks() ==
              std::vector<int>{r / 2 * 2, r / 2 * 2 + 1},
          "shard group ranks");
    Check(mesh->group("replicate")->global_ranks() ==
              std::vector<int>{r % 2, r % 2 + 2},
          "replicate group ranks");
    CheckGroupCollectives(*mesh->group("shard"), at::kFloat);
    CheckGroupCollectives(*mesh->group("replicate"), at::kFloat);
  }
}

TEST(Comm, CollectivesMatchTheirDefinition) {
  for (int n : {1, 2, 3, 4}) {
    LaunchOptions o;
    o.world_size = n;
    o.scenario = "collectives";
    o.timeout = std::chrono::seconds(120);
    auto r = LaunchRanks(o);
    EXPECT_TRUE(r.ok()) << "world " << n << "\n" << r.Describe();
  }
}

// The same checks over Gloo alone (FSDP2_SHM=0 on every rank), and with one
// rank opting out: the ranks must agree to fall back together.
TEST(Comm, CollectivesMatchTheirDefinitionWithoutSharedMemory) {
  for (int n : {2, 3}) {
    LaunchOptions o;
    o.world_size = n;
    o.scenario = "collectives";
    o.timeout = std::chrono::seconds(120);
    o.env["FSDP2_SHM"] = "0";
    auto r = LaunchRanks(o);
    EXPECT_TRUE(r.ok()) << "world " << n << "\n" << r.Describe();
  }
  LaunchOptions o;
  o.world_size = 2;
  o.scenario = "collectives";
  o.timeout = std::chrono::seconds(120);
  o.rank_env[1]["FSDP2_SHM"] = "0";
  auto r = LaunchRanks(o);
  EXPECT_TRUE(r.ok()) << "one rank without shared memory\n" << r.Describe();
}

FSDP2_SCENARIO(peer_exits) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  if (world->rank() == 1) std::_Exit(0);  // gone without a word
  at::Tensor t = at::ones({4});
  world->group()->all_reduce(t).wait();
}

// Over shared memory a peer's death closes no socket: the waiting rank must
// notice the process is gone, well before the 120 s collective timeout.
TEST(Comm, PeerThatExitsFailsTheCollective) {
  LaunchOptions o;
  o.world_size = 2;
  o.scenario = "peer_exits";
  o.env["FSDP2_TIMEOUT_S"] = "120";
  o.timeout = std::chrono::seconds(60);
  auto r = LaunchRanks(o);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_FALSE(r.ranks[0].timed_out) << "rank 0 hung";
  EXPECT_NE(r.ranks[0].exit_code, 0);
  EXPECT_NE(r.ranks[0].log.find("all_reduce failed"), std::string::npos)
      << r.Describe();
}

FSDP2_SCENARIO(just_init) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  world->group()->barrier().wait();
}

TEST(Comm, MismatchedWorldSizeIsAnError) {
  LaunchOptions o;
  o.world_size = 2;
  o.scenario = "just_init";
  o.env["FSDP2_TIMEOUT_S"] = "5";
  o.rank_env[1]["WORLD_SIZE"] = "3";
  o.timeout = std::chrono::seconds(60);
  auto r = LaunchRanks(o);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_FALSE(r.ranks[1].timed_out);
  EXPECT_NE(r.ranks[1].exit_code, 0);
  EXPECT_NE(r.ranks[1].log.find("world size mismatch"), std::string::npos)
      << r.Describe();
  EXPECT_NE(r.ranks[1].log.find("WORLD_SIZE=3"), std::string::npos);
}

FSDP2_SCENARIO(peer_absent) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  if (world->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // never arrives
    return;
  }
  at::Tensor t = at::ones({4});
  world->group()->all_reduce(t).wait();
}

TEST(Comm, PeerThatNeverArrivesTimesOut) {
  LaunchOptions o;
  o.world_size = 2;
  o.scenario = "peer_absent";
  o.env["FSDP2_TIMEOUT_S"] = "3";
  o.timeout = std::chrono::seconds(50);
  auto start = std::chrono::steady_clock::now();
  auto r = LaunchRanks(o);
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_FALSE(r.ranks[0].timed_out) << "rank 0 hung instead of timing out";
  EXPECT_NE(r.ranks[0].exit_code, 0);
  EXPECT_NE(r.ranks[0].log.find("rank 0"), std::string::npos) << r.Describe();
  EXPECT_NE(r.ranks[0].log.find("all_reduce failed"), std::string::npos)
      << r.Describe();
  EXPECT_LT(took, std::chrono::seconds(45));
}

TEST(Comm, RendezvousOptionsRejectBadValues) {
  comm::RendezvousOptions o;
  o.rank = 2;
  o.world_size = 2;
  EXPECT_THROW(comm::World::Init(o), std::invalid_argument);
  // A backend's name is refused where it is read.
  setenv("FSDP2_BACKEND", "mpi", 1);
  EXPECT_THROW(comm::RendezvousOptions::FromEnv(), std::invalid_argument);
  unsetenv("FSDP2_BACKEND");
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
