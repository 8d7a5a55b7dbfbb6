// NcclTransport on a real GPU: NCCL's communicator created through c10d's
// ProcessGroupNCCL, and every collective of the transport on CUDA tensors,
// at world size 1 (NCCL refuses two ranks on one GPU, and the GPU check has
// one). Built in every run; where no CUDA device is present it prints a
// SKIPPED: line and runs nothing.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/internal/c10d.h"

#ifdef FSDP2_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>

#include "core/comm/internal/nccl_transport.h"
#include "core/comm/internal/staged_transport.h"

namespace fsdp2 {
namespace testing {
namespace {

using comm::Piece;
using comm::ReduceOp;
using comm::ReduceScatterAlgorithm;

constexpr std::chrono::milliseconds kTimeout = std::chrono::seconds(60);

std::unique_ptr<comm::internal::NcclTransport> Connect() {
  const std::string path = ::testing::TempDir() + "/nccl_store";
  std::remove(path.c_str());
  auto store = c10::make_intrusive<::c10d::FileStore>(path, 1);
  return std::move(comm::internal::NcclTransport::ConnectLanes(store, /*rank=*/0, /*world=*/1,
                                                               kTimeout, /*lanes=*/1)
                       .front());
}

at::Tensor Values(int64_t n, at::ScalarType dtype) {
  return at::arange(n, at::TensorOptions().dtype(at::kDouble)).add(1).to(dtype).cuda();
}

TEST(NcclTransport, EveryCollectiveOnCudaTensors) {
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
  const std::string path = ::testing::TempDir() + "/nccl_lanes_store";
  std::remove(path.c_str());
  auto store = c10::make_intrusive<::c10d::FileStore>(path, 1);
  auto lanes = comm::internal::NcclTransport::ConnectLanes(store, 0, 1, kTimeout, 2);
  ASSERT_EQ(lanes.size(), 2u);
  ASSERT_EQ(lanes[0]->issue_order(), lanes[1]->issue_order());
  comm::internal::IssueOrder& order = *lanes[0]->issue_order();
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
  std::printf("SKIPPED: nccl_transport_test: this LibTorch has no CUDA\n");
  return 0;
#else
  if (c10::cuda::device_count() == 0) {
    std::printf("SKIPPED: nccl_transport_test: no CUDA device here (NCCL through "
                "NcclTransport runs where a GPU is)\n");
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
#endif
}
