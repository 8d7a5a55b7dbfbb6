// NcclTransport, in two parts.
//
// On the CPU, in every run: the transport's own logic (the piecewise
// all-gather's packing, the reduce-scatter algorithms, bfloat16 broadcast as
// bits, the lanes' shared issue order, the refusal of a collective without a
// ticket while others are pending) driven over c10d's Gloo in place of
// ProcessGroupNCCL, the ranks being threads of this process. Its Shared
// device is the CPU, so CPU tensors are carried as they are (nothing is
// staged through a GPU).
//
// On a real GPU: NCCL's communicator created through c10d's
// ProcessGroupNCCL, and every collective of the transport on CUDA tensors,
// at world size 1 (NCCL refuses two ranks on one GPU, and the GPU check has
// one). Where no CUDA device is visible these cases are skipped and the
// binary prints a SKIPPED: line, unless
//   FSDP2_REQUIRE_GPU=1       (the GPU check): no device is a failure, exit 1;
//   FSDP2_GPU_TEST_DRY_RUN=1  (the GPU check's dry run): the CPU cases are
//                             the run, no SKIPPED: line.
// A LibTorch without CUDA has no NcclTransport: SKIPPED (or, with
// FSDP2_REQUIRE_GPU=1, a failure).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/internal/c10d.h"

namespace {

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}
bool RequireGpu() { return EnvIs("FSDP2_REQUIRE_GPU", "1"); }
bool DryRun() { return EnvIs("FSDP2_GPU_TEST_DRY_RUN", "1"); }

}  // namespace

#ifdef FSDP2_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>

#include "core/comm/internal/gloo_backend.h"
#include "core/comm/internal/nccl_transport.h"
#include "core/comm/internal/staged_transport.h"

namespace fsdp2 {
namespace testing {
namespace {

using comm::Piece;
using comm::ReduceOp;
using comm::ReduceScatterAlgorithm;
using comm::internal::IssueOrder;
using comm::internal::NcclTransport;

constexpr std::chrono::milliseconds kTimeout = std::chrono::seconds(60);

bool HasGpu() { return c10::cuda::device_count() > 0; }

// ------------------------------------------------------------- on the CPU

constexpr std::chrono::milliseconds kCpuTimeout = std::chrono::seconds(20);

void Check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

// The lanes of one rank: NcclTransports sharing one Gloo backend and one
// issue order, as ConnectLanes makes them around one ProcessGroupNCCL.
using Lanes = std::vector<std::unique_ptr<NcclTransport>>;

// Runs fn(rank, lanes) on `world` threads, each a rank with `lanes`
// transports over Gloo; a failure on any rank fails the test.
void OnGlooRanks(int world, int lanes, const std::function<void(int, Lanes&)>& fn) {
  static std::atomic<int> groups{0};
  const std::string path =
      ::testing::TempDir() + "/gloo_store_" + std::to_string(groups++);
  std::remove(path.c_str());
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto store = c10::make_intrusive<::c10d::FileStore>(path, world);
        store->setTimeout(kCpuTimeout);
        auto gloo = comm::internal::ConnectGlooBackend(
            store, rank, world, comm::internal::GlooDeviceForAddress("127.0.0.1"), kCpuTimeout);
        auto shared = std::make_shared<NcclTransport::Shared>(gloo, kCpuTimeout,
                                                              at::Device(at::kCPU));
        Lanes transports;
        for (int lane = 0; lane < lanes; ++lane) {
          transports.push_back(std::make_unique<NcclTransport>(shared, rank, world, kCpuTimeout));
        }
        fn(rank, transports);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(errors[rank], "") << "rank " << rank;
}

// rank r contributes r * 10 + [0, n): small integers, exact in every dtype
// tested (bfloat16 included) whatever the summation order.
at::Tensor Contribution(int rank, int64_t n, at::ScalarType dtype) {
  return (at::arange(n, at::kDouble) + rank * 10.0).to(dtype);
}

at::Tensor SumOfContributions(int world, int64_t n, at::ScalarType dtype) {
  at::Tensor sum = at::zeros({n}, dtype);
  for (int k = 0; k < world; ++k) sum += Contribution(k, n, dtype);
  return sum;
}

// Every collective of `t` against its definition, `n` elements per rank.
void CheckCollectives(NcclTransport& t, at::ScalarType dtype, int64_t n) {
  const int W = t.world(), r = t.rank();
  const std::string where = " (" + std::string(c10::toString(dtype)) + ", " +
                            std::to_string(n) + " per rank, rank " + std::to_string(r) + ")";
  at::Tensor out = at::empty({W * n}, dtype);
  t.all_gather_into_flat(out, Contribution(r, n, dtype));
  for (int k = 0; k < W; ++k) {
    Check(out.narrow(0, k * n, n).equal(Contribution(k, n, dtype)),
          "all_gather_into_flat chunk " + std::to_string(k) + where);
  }
  // Pieces of 3, 0 and n elements per rank; each rank fills only its own:
  // the transport packs them into one flat all-gather and unpacks it.
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
  for (auto algorithm : {ReduceScatterAlgorithm::kAuto, ReduceScatterAlgorithm::kRing,
                         ReduceScatterAlgorithm::kAllReduce}) {
    at::Tensor slice = at::empty({n}, dtype);
    t.reduce_scatter_flat(slice, Contribution(r, W * n, dtype), algorithm);
    Check(slice.equal(sum.narrow(0, r * n, n)),
          "reduce_scatter_flat algorithm " + std::to_string(static_cast<int>(algorithm)) + where);
  }
  at::Tensor reduced = Contribution(r, n, dtype);
  t.all_reduce(reduced, ReduceOp::kSum);
  Check(reduced.equal(sum.narrow(0, 0, n)), "all_reduce sum" + where);
  at::Tensor largest = Contribution(r, n, dtype);
  t.all_reduce(largest, ReduceOp::kMax);
  Check(largest.equal(Contribution(W - 1, n, dtype)), "all_reduce max" + where);
  for (int root : {0, W - 1}) {
    at::Tensor b = Contribution(r, n, dtype);
    t.broadcast(b, root);
    Check(b.equal(Contribution(root, n, dtype)), "broadcast from " + std::to_string(root) + where);
  }
  // bfloat16 is broadcast as float16 bits: values no float16 holds (NaN
  // payloads, huge and tiny numbers) arrive unchanged.
  if (dtype == at::kBFloat16) {
    at::Tensor bits = at::tensor({1e30, -3e-30, 1.0 / 3.0}, at::kDouble).to(at::kBFloat16);
    at::Tensor b = r == 0 ? bits.clone() : at::zeros({3}, at::kBFloat16);
    t.broadcast(b, 0);
    Check(b.view(at::kShort).equal(bits.view(at::kShort)), "bfloat16 broadcast bits" + where);
  }
  t.barrier();
}

TEST(NcclTransportOnGloo, EveryCollectiveMatchesItsDefinition) {
  for (int world : {1, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    OnGlooRanks(world, 1, [](int, Lanes& lanes) {
      EXPECT_STREQ(lanes[0]->kind(), "nccl");
      for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
        CheckCollectives(*lanes[0], dtype, 5);
      }
      CheckCollectives(*lanes[0], at::kFloat, 1000);
    });
  }
}

// Two lanes sharing one communicator, the tickets taken in one order on
// both ranks, the lanes' threads started late on opposite ranks (rank 0's
// gathering lane, rank 1's reducing lane): issued as they come, rank 0
// would start with a reduce-scatter where rank 1 starts with an
// all-gather. In ticket order every collective meets its match.
TEST(NcclTransportOnGloo, LanesIssueInTicketOrderWhateverTheirTiming) {
  OnGlooRanks(2, 2, [](int rank, Lanes& lanes) {
    Check(lanes[0]->issue_order() == lanes[1]->issue_order(), "the lanes share one order");
    IssueOrder& order = *lanes[0]->issue_order();
    const int rounds = 8;
    const int64_t n = 4096;
    std::vector<int64_t> gather_tickets, reduce_tickets;
    for (int i = 0; i < rounds; ++i) {
      gather_tickets.push_back(order.Take());
      reduce_tickets.push_back(order.Take());
    }
    std::vector<at::Tensor> gathered(rounds), reduced(rounds);
    std::vector<std::string> errors(2);
    auto late = [&](int lane) {
      if (lane == rank) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    };
    std::thread gathers([&] {
      try {
        late(0);
        for (int i = 0; i < rounds; ++i) {
          gathered[i] = at::empty({2 * n}, at::kFloat);
          lanes[0]->set_ticket(gather_tickets[i]);
          lanes[0]->all_gather_into_flat(gathered[i], Contribution(rank, n, at::kFloat) * i);
        }
      } catch (const std::exception& e) {
        errors[0] = e.what();
      }
    });
    std::thread reductions([&] {
      try {
        late(1);
        for (int i = 0; i < rounds; ++i) {
          reduced[i] = at::empty({n}, at::kFloat);
          lanes[1]->set_ticket(reduce_tickets[i]);
          lanes[1]->reduce_scatter_flat(reduced[i], Contribution(rank, 2 * n, at::kFloat) + i,
                                        ReduceScatterAlgorithm::kAuto);
        }
      } catch (const std::exception& e) {
        errors[1] = e.what();
      }
    });
    gathers.join();
    reductions.join();
    Check(errors[0].empty(), "gathering lane: " + errors[0]);
    Check(errors[1].empty(), "reducing lane: " + errors[1]);
    Check(order.next_to_issue() == 2 * rounds, "every ticket turned");
    const at::Tensor sum = SumOfContributions(2, 2 * n, at::kFloat);
    for (int i = 0; i < rounds; ++i) {
      for (int k = 0; k < 2; ++k) {
        Check(gathered[i].narrow(0, k * n, n).equal(Contribution(k, n, at::kFloat) * i),
              "all-gather " + std::to_string(i));
      }
      Check(reduced[i].equal(sum.narrow(0, rank * n, n) + 2 * i),
            "reduce-scatter " + std::to_string(i));
    }
  });
}

// Driven directly (no ticket), a collective is right only while nothing
// else is in the order: with a ticket pending it would issue ahead of a
// collective taken before it, so it is refused.
TEST(NcclTransportOnGloo, ACollectiveWithoutATicketIsRefusedWhileOthersArePending) {
  OnGlooRanks(1, 2, [](int, Lanes& lanes) {
    at::Tensor t = at::ones({4}, at::kFloat);
    lanes[0]->all_reduce(t, ReduceOp::kSum);  // nothing pending: allowed
    lanes[1]->broadcast(t, 0);
    const int64_t pending = lanes[0]->issue_order()->Take();
    Check(pending == 2, "two collectives issued before");
    for (auto& lane : lanes) {
      try {
        lane->all_reduce(t, ReduceOp::kSum);
        throw std::runtime_error("a collective without a ticket issued while one was pending");
      } catch (const std::logic_error& e) {
        Check(std::string(e.what()).find("issue it through ProcessGroup") != std::string::npos,
              std::string("the refusal says what to do: ") + e.what());
      }
    }
  });
}

// -------------------------------------------------------------- on a GPU

std::unique_ptr<NcclTransport> Connect() {
  const std::string path = ::testing::TempDir() + "/nccl_store";
  std::remove(path.c_str());
  auto store = c10::make_intrusive<::c10d::FileStore>(path, 1);
  return std::move(NcclTransport::ConnectLanes(store, /*rank=*/0, /*world=*/1, kTimeout,
                                               /*lanes=*/1)
                       .front());
}

at::Tensor Values(int64_t n, at::ScalarType dtype) {
  return at::arange(n, at::TensorOptions().dtype(at::kDouble)).add(1).to(dtype).cuda();
}

#define FSDP2_NEEDS_A_GPU() \
  if (!HasGpu()) GTEST_SKIP() << "no CUDA device is visible"

TEST(NcclTransport, EveryCollectiveOnCudaTensors) {
  FSDP2_NEEDS_A_GPU();
  auto t = Connect();
  EXPECT_STREQ(t->kind(), "nccl");
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const int64_t n = 1000;
    at::Tensor out = at::empty({n}, Values(1, dtype).options());
    t->all_gather_into_flat(out, Values(n, dtype));
    EXPECT_TRUE(out.equal(Values(n, dtype)));

    at::Tensor buffer = Values(n + 3, dtype);
    t->all_gather_pieces(buffer, {{0, 3}, {3, 0}, {3, n}});
    EXPECT_TRUE(buffer.equal(Values(n + 3, dtype)));

    for (auto algorithm : {ReduceScatterAlgorithm::kAuto, ReduceScatterAlgorithm::kRing,
                           ReduceScatterAlgorithm::kAllReduce}) {
      at::Tensor slice = at::empty({n}, out.options());
      t->reduce_scatter_flat(slice, Values(n, dtype), algorithm);
      EXPECT_TRUE(slice.equal(Values(n, dtype))) << static_cast<int>(algorithm);
    }
    at::Tensor sum = Values(n, dtype);
    t->all_reduce(sum, ReduceOp::kSum);
    EXPECT_TRUE(sum.equal(Values(n, dtype)));
    at::Tensor b = Values(n, dtype);
    t->broadcast(b, 0);
    EXPECT_TRUE(b.equal(Values(n, dtype)));
    EXPECT_TRUE(b.is_cuda());
  }
  t->barrier();
}

// CPU tensors (the flags and counts checkpoints exchange) travel through
// the group's GPU, staged as ConnectTransport stages every NCCL lane: every
// collective, results back in the CPU tensors.
TEST(NcclTransport, CpuTensorsTravelThroughTheGpu) {
  FSDP2_NEEDS_A_GPU();
  auto nccl = Connect();
  const at::Device gpu = nccl->device();
  auto t = comm::internal::StagedTransport::ThroughDevice(std::move(nccl), gpu);
  const int64_t n = 100;
  auto cpu = [&] { return at::arange(n, at::kDouble).add(1); };
  at::Tensor out = at::empty({n}, at::kDouble);
  t->all_gather_into_flat(out, cpu());
  EXPECT_TRUE(out.equal(cpu()));
  at::Tensor buffer = cpu();
  t->all_gather_pieces(buffer, {{0, 10}, {10, n - 10}});
  EXPECT_TRUE(buffer.equal(cpu()));
  at::Tensor slice = at::empty({n}, at::kDouble);
  t->reduce_scatter_flat(slice, cpu(), ReduceScatterAlgorithm::kAuto);
  EXPECT_TRUE(slice.equal(cpu()));
  at::Tensor flags = at::tensor({0.0, 1.0, 0.0}, at::kDouble);
  t->all_reduce(flags, ReduceOp::kMax);
  EXPECT_TRUE(flags.equal(at::tensor({0.0, 1.0, 0.0}, at::kDouble)));
  at::Tensor b = cpu();
  t->broadcast(b, 0);
  EXPECT_TRUE(b.equal(cpu()));
  for (const at::Tensor& x : {out, buffer, slice, flags, b}) EXPECT_TRUE(x.is_cpu());
  t->barrier();
}

// A group's two lanes share one communicator: collectives issued in one
// order (tickets taken here, as ProcessGroup takes them) and run from two
// threads, the first lane's late, all complete with the right values.
TEST(NcclTransport, LanesShareOneCommunicatorInIssueOrder) {
  FSDP2_NEEDS_A_GPU();
  const std::string path = ::testing::TempDir() + "/nccl_lanes_store";
  std::remove(path.c_str());
  auto store = c10::make_intrusive<::c10d::FileStore>(path, 1);
  auto lanes = NcclTransport::ConnectLanes(store, 0, 1, kTimeout, 2);
  ASSERT_EQ(lanes.size(), 2u);
  ASSERT_EQ(lanes[0]->issue_order(), lanes[1]->issue_order());
  IssueOrder& order = *lanes[0]->issue_order();
  const int64_t n = 1 << 16;
  const int rounds = 8;
  std::vector<int64_t> gather_tickets, reduce_tickets;
  for (int i = 0; i < rounds; ++i) {
    gather_tickets.push_back(order.Take());
    reduce_tickets.push_back(order.Take());
  }
  std::vector<at::Tensor> gathered(rounds), reduced(rounds);
  std::thread gathers([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int i = 0; i < rounds; ++i) {
      gathered[i] = at::empty({n}, Values(1, at::kFloat).options());
      lanes[0]->set_ticket(gather_tickets[i]);
      lanes[0]->all_gather_into_flat(gathered[i], Values(n, at::kFloat).mul(i));
    }
  });
  std::thread reductions([&] {
    for (int i = 0; i < rounds; ++i) {
      reduced[i] = at::empty({n}, Values(1, at::kFloat).options());
      lanes[1]->set_ticket(reduce_tickets[i]);
      lanes[1]->reduce_scatter_flat(reduced[i], Values(n, at::kFloat).add(i),
                                    ReduceScatterAlgorithm::kAuto);
    }
  });
  gathers.join();
  reductions.join();
  c10::cuda::device_synchronize();
  EXPECT_EQ(order.next_to_issue(), 2 * rounds);
  for (int i = 0; i < rounds; ++i) {
    EXPECT_TRUE(gathered[i].equal(Values(n, at::kFloat).mul(i))) << i;
    EXPECT_TRUE(reduced[i].equal(Values(n, at::kFloat).add(i))) << i;
  }
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2
#endif  // FSDP2_WITH_CUDA

int main(int argc, char** argv) {
#ifndef FSDP2_WITH_CUDA
  if (RequireGpu()) {
    std::fprintf(stderr, "FAILED: nccl_transport_test: FSDP2_REQUIRE_GPU=1, but this LibTorch "
                         "has no CUDA (no NCCL to test)\n");
    return 1;
  }
  std::printf("SKIPPED: nccl_transport_test: this LibTorch has no CUDA\n");
  return 0;
#else
  ::testing::InitGoogleTest(&argc, argv);
  const bool gpu = fsdp2::testing::HasGpu();
  if (!gpu && RequireGpu()) {
    std::fprintf(stderr, "FAILED: nccl_transport_test: FSDP2_REQUIRE_GPU=1, but no CUDA device "
                         "is visible (none is present, or CUDA failed to initialise): its NCCL "
                         "cases cannot run\n");
    return 1;
  }
  const int status = RUN_ALL_TESTS();
  if (!gpu && !DryRun()) {
    std::printf("SKIPPED: nccl_transport_test: no CUDA device here: its NCCL cases on a GPU "
                "did not run (its cases over Gloo on the CPU did)\n");
  }
  return status;
#endif
}
