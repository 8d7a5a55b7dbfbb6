#include "core/comm/internal/nccl_transport.h"

#ifdef USE_C10D_NCCL

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdlib>

#include "core/comm/internal/c10d_collectives.h"

namespace fsdp2 {
namespace comm {
namespace internal {

std::vector<std::unique_ptr<NcclTransport>> NcclTransport::ConnectLanes(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int world,
    std::chrono::milliseconds timeout, int lanes) {
  // ProcessGroupNCCL's watchdog ends the whole process when a collective
  // times out (its default error handling tears down without clean-up).
  // CleanUpOnly (2) aborts the communicators instead, so the waiting call
  // fails and fsdp2 reports its named TimeoutError. A value the user set
  // wins.
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
  auto options = ::c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  // The calling thread's GPU: setup_environment() made the rank's GPU
  // current before any group is created. (The lanes' threads have their
  // own current device, GPU 0 unless set.)
  const at::Device device = c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getDevice();
  auto shared = std::make_shared<Shared>(
      c10::make_intrusive<::c10d::ProcessGroupNCCL>(store, rank, world, options), timeout,
      device);
  std::vector<std::unique_ptr<NcclTransport>> transports;
  for (int lane = 0; lane < lanes; ++lane) {
    transports.push_back(std::make_unique<NcclTransport>(shared, rank, world, timeout));
  }
  return transports;
}

NcclTransport::NcclTransport(std::shared_ptr<Shared> shared, int rank, int world,
                             std::chrono::milliseconds timeout)
    : Transport(rank, world), shared_(std::move(shared)), nccl_(*shared_->nccl),
      timeout_(timeout) {}

at::Tensor NcclTransport::OnGpu(const at::Tensor& t) const {
  return t.is_cpu() ? t.to(shared_->device) : t;
}

void NcclTransport::all_gather_into_flat(const at::Tensor& output,
                                         const at::Tensor& input) {
  if (Staged(output)) {
    const at::Tensor out = OnGpu(output);
    all_gather_into_flat(out, OnGpu(input));
    output.copy_(out);  // to pageable memory: waits for the device
    return;
  }
  at::Tensor out = output, in = input;
  IssueOrder::Turn turn = TakeTurn();
  auto work = nccl_._allgather_base(out, in);
  turn.Release();
  Wait(work, timeout_);
}

// Gathers this rank's parts, packed, into a flat buffer of every rank's
// packs, then scatters those into the pieces.
void NcclTransport::all_gather_pieces(const at::Tensor& buffer_in,
                                      const std::vector<Piece>& pieces) {
  if (Staged(buffer_in)) {
    const at::Tensor buffer = OnGpu(buffer_in);
    all_gather_pieces(buffer, pieces);
    buffer_in.copy_(buffer);
    return;
  }
  const at::Tensor buffer = buffer_in.view(-1);
  const int world_size = world();
  int64_t per_rank = 0;
  for (const auto& p : pieces) per_rank += p.numel;
  // Every collective turns its ticket, also one with nothing to move.
  IssueOrder::Turn turn = TakeTurn();
  if (per_rank == 0) return;
  at::Tensor in = at::empty({per_rank}, buffer.options());
  at::Tensor out = at::empty({world_size * per_rank}, buffer.options());
  int64_t at_offset = 0;
  for (const auto& p : pieces) {
    in.narrow(0, at_offset, p.numel)
        .copy_(buffer.narrow(0, world_size * p.offset + rank() * p.numel,
                             p.numel));
    at_offset += p.numel;
  }
  auto work = nccl_._allgather_base(out, in);
  turn.Release();
  Wait(work, timeout_);
  auto by_rank = out.view({world_size, per_rank});
  at_offset = 0;
  for (const auto& p : pieces) {
    buffer.narrow(0, world_size * p.offset, world_size * p.numel)
        .view({world_size, p.numel})
        .copy_(by_rank.narrow(1, at_offset, p.numel));
    at_offset += p.numel;
  }
}

void NcclTransport::reduce_scatter_flat(const at::Tensor& output,
                                        const at::Tensor& input,
                                        ReduceScatterAlgorithm algorithm) {
  if (Staged(output)) {
    const at::Tensor out = OnGpu(output);
    reduce_scatter_flat(out, OnGpu(input), algorithm);  // `input` is scratch afterwards
    output.copy_(out);
    return;
  }
  switch (algorithm) {
    case ReduceScatterAlgorithm::kAuto: {
      at::Tensor out = output, in = input;
      IssueOrder::Turn turn = TakeTurn();
      auto work = nccl_._reduce_scatter_base(out, in);
      turn.Release();
      Wait(work, timeout_);
      return;
    }
    case ReduceScatterAlgorithm::kRing: {
      // Steps of sends and receives that wait for each other: the turn
      // covers them all.
      IssueOrder::Turn turn = TakeTurn();
      RingReduceScatter(nccl_, rank(), world(), timeout_, output, input, ring_scratch_);
      return;
    }
    case ReduceScatterAlgorithm::kAllReduce:
      reduce_scatter_by_all_reduce(output, input);  // all_reduce() turns the ticket
      return;
  }
}

void NcclTransport::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  if (Staged(tensor)) {
    const at::Tensor t = OnGpu(tensor);
    all_reduce(t, op);
    tensor.copy_(t);
    return;
  }
  std::vector<at::Tensor> tensors{tensor};
  ::c10d::AllreduceOptions opts;
  opts.reduceOp = op == ReduceOp::kSum ? ::c10d::ReduceOp::SUM : ::c10d::ReduceOp::MAX;
  IssueOrder::Turn turn = TakeTurn();
  auto work = nccl_.allreduce(tensors, opts);
  turn.Release();
  Wait(work, timeout_);
}

void NcclTransport::broadcast(const at::Tensor& tensor, int root) {
  if (Staged(tensor)) {
    const at::Tensor t = OnGpu(tensor);
    broadcast(t, root);
    tensor.copy_(t);
    return;
  }
  // Pure data movement: bfloat16 travels bit for bit as float16, as in
  // BroadcastBits.
  std::vector<at::Tensor> tensors{
      tensor.scalar_type() == at::kBFloat16 ? tensor.view(at::kHalf) : tensor};
  ::c10d::BroadcastOptions opts;
  opts.rootRank = root;
  IssueOrder::Turn turn = TakeTurn();
  auto work = nccl_.broadcast(tensors, opts);
  turn.Release();
  Wait(work, timeout_);
}

// An all-reduce of one element on this rank's GPU, waited for: what
// ProcessGroupNCCL's barrier does, without its guess of the device.
void NcclTransport::barrier() {
  all_reduce(at::zeros({1}, at::TensorOptions().device(shared_->device)), ReduceOp::kSum);
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // USE_C10D_NCCL
