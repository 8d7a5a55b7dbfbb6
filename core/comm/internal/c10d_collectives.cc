#include "core/comm/internal/c10d_collectives.h"
#include "core/common/error.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Ring steps move their chunk in pieces of this size (see RingReduceScatter).
constexpr int64_t kSegmentBytes = 1 << 20;

}  // namespace

void Wait(const c10::intrusive_ptr<::c10d::Work>& work,
          std::chrono::milliseconds timeout) {
  if (!work->wait(timeout)) {
    throw TimeoutError("timed out after " +
                             std::to_string(timeout.count()) + " ms");
  }
}

// In step s every rank forwards rank (r - s)'s parts, received in step
// s - 1, to its right neighbour.
void RingAllGatherPieces(::c10d::Backend& backend, int rank, int world,
                         std::chrono::milliseconds timeout,
                         const at::Tensor& buffer_in,
                         const std::vector<Piece>& pieces) {
  const at::Tensor buffer = buffer_in.view(-1);
  auto part = [&](const Piece& p, int r) {
    return buffer.narrow(0, world * p.offset + r * p.numel, p.numel);
  };
  const int right = Mod(rank + 1, world), left = Mod(rank - 1, world);
  for (int step = 0; step < world - 1; ++step) {
    const int send_rank = Mod(rank - step, world);
    const int recv_rank = Mod(rank - step - 1, world);
    std::vector<c10::intrusive_ptr<::c10d::Work>> works;
    int tag = 0;
    for (const auto& p : pieces) {
      if (p.numel == 0) continue;
      std::vector<at::Tensor> recv{part(p, recv_rank)};
      std::vector<at::Tensor> send{part(p, send_rank)};
      works.push_back(backend.recv(recv, left, tag));
      works.push_back(backend.send(send, right, tag));
      ++tag;
    }
    for (auto& work : works) Wait(work, timeout);
  }
}

// In step s rank r sends its partial sum of chunk r-s-1 to the right and
// adds the left neighbour's partial sum of chunk r-s-2. After W-1 steps
// chunk r holds the full sum on rank r. Each step moves its chunk in
// segments, all posted at once, so the additions overlap the transfer of
// later segments.
void RingReduceScatter(::c10d::Backend& backend, int rank, int world,
                       std::chrono::milliseconds timeout,
                       const at::Tensor& output, const at::Tensor& input,
                       at::Tensor& scratch) {
  auto chunks = input.view({world, -1});
  const int64_t chunk_numel = chunks.size(1);
  const int64_t segment =
      std::max<int64_t>(1, kSegmentBytes / input.element_size());
  if (!scratch.defined() || scratch.nbytes() < chunks[0].nbytes() ||
      scratch.scalar_type() != input.scalar_type() ||
      scratch.device() != input.device()) {
    scratch = at::empty_like(chunks[0]);
  }
  at::Tensor incoming = scratch.narrow(0, 0, chunk_numel);
  const int right = Mod(rank + 1, world), left = Mod(rank - 1, world);
  for (int step = 0; step < world - 1; ++step) {
    const int send_chunk = Mod(rank - step - 1, world);
    const int recv_chunk = Mod(rank - step - 2, world);
    std::vector<c10::intrusive_ptr<::c10d::Work>> recvs, sends;
    std::vector<int64_t> starts;
    int tag = 0;
    for (int64_t start = 0; start < chunk_numel; start += segment) {
      const int64_t len = std::min(segment, chunk_numel - start);
      std::vector<at::Tensor> recv{incoming.narrow(0, start, len)};
      std::vector<at::Tensor> send{chunks[send_chunk].narrow(0, start, len)};
      recvs.push_back(backend.recv(recv, left, tag));
      sends.push_back(backend.send(send, right, tag));
      starts.push_back(start);
      ++tag;
    }
    for (size_t i = 0; i < recvs.size(); ++i) {
      Wait(recvs[i], timeout);
      const int64_t len = std::min(segment, chunk_numel - starts[i]);
      chunks[recv_chunk].narrow(0, starts[i], len).add_(
          incoming.narrow(0, starts[i], len));
    }
    for (auto& work : sends) Wait(work, timeout);
  }
  output.view(-1).copy_(chunks[rank]);
}

c10::intrusive_ptr<::c10d::Work> IssueAllReduce(::c10d::Backend& backend,
                                                const at::Tensor& tensor, ReduceOp op) {
  std::vector<at::Tensor> tensors{tensor};
  ::c10d::AllreduceOptions opts;
  opts.reduceOp =
      op == ReduceOp::kSum ? ::c10d::ReduceOp::SUM : ::c10d::ReduceOp::MAX;
  return backend.allreduce(tensors, opts);
}

void AllReduce(::c10d::Backend& backend, std::chrono::milliseconds timeout,
               const at::Tensor& tensor, ReduceOp op) {
  Wait(IssueAllReduce(backend, tensor, op), timeout);
}

c10::intrusive_ptr<::c10d::Work> IssueBroadcastBits(::c10d::Backend& backend,
                                                    const at::Tensor& tensor, int root) {
  std::vector<at::Tensor> tensors{tensor.scalar_type() == at::kBFloat16
                                      ? tensor.view(at::kHalf)
                                      : tensor};
  ::c10d::BroadcastOptions opts;
  opts.rootRank = root;
  return backend.broadcast(tensors, opts);
}

void BroadcastBits(::c10d::Backend& backend, std::chrono::milliseconds timeout,
                   const at::Tensor& tensor, int root) {
  Wait(IssueBroadcastBits(backend, tensor, root), timeout);
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
