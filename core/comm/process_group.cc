#include "core/comm/process_group.h"

#include <ATen/ATen.h>

#include <sstream>
#include <stdexcept>

#include "core/comm/internal/process_group_impl.h"

namespace fsdp2 {
namespace comm {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Ring steps move their chunk in pieces of this size (see reduce_scatter).
constexpr int64_t kSegmentBytes = 1 << 20;

void CheckContiguous(const at::Tensor& t, const char* what, const char* op) {
  TORCH_CHECK(t.defined() && t.is_contiguous(), op, ": ", what,
              " must be a defined, contiguous tensor");
}

void Wait(const c10::intrusive_ptr<::c10d::Work>& work,
          std::chrono::milliseconds timeout) {
  if (!work->wait(timeout)) {
    throw std::runtime_error("timed out after " +
                             std::to_string(timeout.count()) + " ms");
  }
}

}  // namespace

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

ProcessGroup::~ProcessGroup() {
  // Stop the workers (draining queued work) before the communicators go.
  for (auto& lane : impl_->lanes) lane.reset();
}

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const {
  return static_cast<int>(impl_->global_ranks.size());
}
const std::string& ProcessGroup::name() const { return impl_->name; }
const std::vector<int>& ProcessGroup::global_ranks() const {
  return impl_->global_ranks;
}
std::string ProcessGroup::backend() const {
  return impl_->backends[0]->getBackendName();
}
std::chrono::milliseconds ProcessGroup::timeout() const {
  return impl_->timeout;
}
int64_t ProcessGroup::bytes_sent() const { return impl_->bytes_sent.load(); }

CommHandle ProcessGroup::submit(Lane lane, std::function<void()> fn) {
  return impl_->lanes[static_cast<int>(lane)]->submit(std::move(fn));
}

namespace {

// Runs `body` as collective `op` on `lane`, rethrowing any failure with the
// rank, collective and group in the message.
CommHandle RunCollective(ProcessGroup::Impl* impl, Lane lane, const char* op,
                         std::function<void(internal::C10dBackend&)> body) {
  auto* backend = impl->backends[static_cast<int>(lane)].get();
  std::string where = [&] {
    std::ostringstream s;
    s << "fsdp2: rank " << impl->world_rank << " (rank " << impl->rank
      << " of " << impl->global_ranks.size() << " in group '" << impl->name
      << "'): " << op << " failed: ";
    return s.str();
  }();
  return impl->lanes[static_cast<int>(lane)]->submit(
      [backend, body = std::move(body), where = std::move(where)] {
        try {
          body(*backend);
        } catch (const c10::Error& e) {
          throw std::runtime_error(where + e.what_without_backtrace());
        } catch (const std::exception& e) {
          throw std::runtime_error(where + e.what());
        }
      });
}

// The lane's shared-memory transport when it can carry `t`, else null.
internal::ShmTransport* ShmFor(ProcessGroup::Impl* impl, Lane lane,
                               const at::Tensor& t) {
  return t.is_cpu() ? impl->shm[static_cast<int>(lane)].get() : nullptr;
}

// All-gather of a piecewise buffer (see all_gather_pieces) as a ring of
// send/recv, one message per piece: in step s every rank forwards rank
// (r - s)'s parts, received in step s - 1, to its right neighbour; W - 1
// steps, no extra buffers.
void RingAllGatherPieces(internal::C10dBackend& backend,
                         const ProcessGroup::Impl& impl,
                         const at::Tensor& buffer,
                         const std::vector<ProcessGroup::Piece>& pieces) {
  const int world = static_cast<int>(impl.global_ranks.size());
  const int rank = impl.rank;
  auto part = [&](const ProcessGroup::Piece& p, int r) {
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
    for (auto& work : works) Wait(work, impl.timeout);
  }
}

bool HasNativeFlatCollectives(const internal::C10dBackend& backend) {
  return backend.getBackendName() == "nccl";
}

// Gloo in LibTorch 1.13 cannot reduce 16-bit floats: reduce those in fp32.
void AllReduceInPlace(internal::C10dBackend& backend, at::Tensor tensor,
                      ::c10d::ReduceOp op, std::chrono::milliseconds timeout) {
  const bool upcast = backend.getBackendName() == "gloo" &&
                      (tensor.scalar_type() == at::kBFloat16 ||
                       tensor.scalar_type() == at::kHalf);
  std::vector<at::Tensor> tensors{upcast ? tensor.to(at::kFloat) : tensor};
  ::c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  Wait(backend.allreduce(tensors, opts), timeout);
  if (upcast) tensor.copy_(tensors[0]);
}

}  // namespace

CommHandle ProcessGroup::all_gather_into_flat(at::Tensor output,
                                              at::Tensor input, Lane lane) {
  CheckContiguous(output, "output", "all_gather_into_flat");
  CheckContiguous(input, "input", "all_gather_into_flat");
  const int world = size();
  TORCH_CHECK(output.numel() == input.numel() * world,
              "all_gather_into_flat: output has ", output.numel(),
              " elements, expected ", world, " x ", input.numel());
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "all_gather_into_flat: dtypes differ");
  Impl* impl = impl_.get();
  impl->bytes_sent += input.nbytes() * (world - 1);
  internal::ShmTransport* shm = ShmFor(impl, lane, output);
  return RunCollective(
      impl, lane, "all_gather", [impl, output, input, world, shm](auto& backend) {
        const int rank = impl->rank;
        auto chunks = output.view({world, -1});
        if (world == 1) {
          chunks[0].copy_(input.view(-1));
          return;
        }
        if (shm == nullptr && HasNativeFlatCollectives(backend)) {
          at::Tensor out = output, in = input;
          Wait(backend._allgather_base(out, in), impl->timeout);
          return;
        }
        // A flat output is the piecewise layout with a single piece.
        chunks[rank].copy_(input.view(-1));
        const std::vector<Piece> whole{{0, input.numel()}};
        if (shm != nullptr) {
          shm->all_gather_pieces(output, whole);
        } else {
          RingAllGatherPieces(backend, *impl, output, whole);
        }
      });
}

CommHandle ProcessGroup::all_gather_pieces(at::Tensor buffer,
                                           std::vector<Piece> pieces,
                                           Lane lane) {
  CheckContiguous(buffer, "buffer", "all_gather_pieces");
  const int world = size();
  int64_t per_rank = 0;
  for (const auto& p : pieces) {
    TORCH_CHECK(p.offset >= 0 && p.numel >= 0 &&
                    world * (p.offset + p.numel) <= buffer.numel(),
                "all_gather_pieces: piece [", p.offset, ", +", p.numel,
                ") does not fit a buffer of ", buffer.numel(), " elements");
    per_rank += p.numel;
  }
  Impl* impl = impl_.get();
  impl->bytes_sent += per_rank * buffer.element_size() * (world - 1);
  internal::ShmTransport* shm = ShmFor(impl, lane, buffer);
  return RunCollective(
      impl, lane, "all_gather",
      [impl, buffer, pieces = std::move(pieces), per_rank, world,
       shm](auto& backend) {
        if (world == 1 || per_rank == 0) return;
        if (shm != nullptr) {
          shm->all_gather_pieces(buffer, pieces);
          return;
        }
        const int rank = impl->rank;
        auto part = [&](const Piece& p, int r) {
          return buffer.narrow(0, world * p.offset + r * p.numel, p.numel);
        };
        if (HasNativeFlatCollectives(backend)) {
          at::Tensor in = at::empty({per_rank}, buffer.options());
          at::Tensor out = at::empty({world * per_rank}, buffer.options());
          int64_t at_offset = 0;
          for (const auto& p : pieces) {
            in.narrow(0, at_offset, p.numel).copy_(part(p, rank));
            at_offset += p.numel;
          }
          Wait(backend._allgather_base(out, in), impl->timeout);
          auto by_rank = out.view({world, per_rank});
          at_offset = 0;
          for (const auto& p : pieces) {
            buffer.narrow(0, world * p.offset, world * p.numel)
                .view({world, p.numel})
                .copy_(by_rank.narrow(1, at_offset, p.numel));
            at_offset += p.numel;
          }
          return;
        }
        RingAllGatherPieces(backend, *impl, buffer, pieces);
      });
}

CommHandle ProcessGroup::reduce_scatter_flat(at::Tensor output,
                                             at::Tensor input, Lane lane,
                                             ReduceScatterAlgorithm algorithm) {
  CheckContiguous(output, "output", "reduce_scatter_flat");
  CheckContiguous(input, "input", "reduce_scatter_flat");
  const int world = size();
  TORCH_CHECK(input.numel() == output.numel() * world,
              "reduce_scatter_flat: input has ", input.numel(),
              " elements, expected ", world, " x ", output.numel());
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "reduce_scatter_flat: dtypes differ");
  Impl* impl = impl_.get();
  const bool use_all_reduce = algorithm == ReduceScatterAlgorithm::kAllReduce;
  impl->bytes_sent +=
      output.nbytes() * (world - 1) * (use_all_reduce ? 2 : 1);
  const int lane_index = static_cast<int>(lane);
  // An explicit algorithm is a request for that backend algorithm (tests,
  // benchmarks); kAuto takes shared memory when the group has it.
  internal::ShmTransport* shm =
      algorithm == ReduceScatterAlgorithm::kAuto ? ShmFor(impl, lane, input)
                                                 : nullptr;
  return RunCollective(
      impl, lane, "reduce_scatter",
      [impl, output, input, world, algorithm, lane_index,
       shm](auto& backend) {
        const int rank = impl->rank;
        auto chunks = input.view({world, -1});
        if (world == 1) {
          output.view(-1).copy_(chunks[0]);
          return;
        }
        if (shm != nullptr) {
          shm->reduce_scatter(output.view(-1), input);
          return;
        }
        if (algorithm == ReduceScatterAlgorithm::kAllReduce) {
          AllReduceInPlace(backend, input, ::c10d::ReduceOp::SUM, impl->timeout);
          output.view(-1).copy_(chunks[rank]);
          return;
        }
        if (algorithm == ReduceScatterAlgorithm::kAuto &&
            HasNativeFlatCollectives(backend)) {
          at::Tensor out = output, in = input;
          Wait(backend._reduce_scatter_base(out, in), impl->timeout);
          return;
        }
        // Ring: in step s rank r sends its partial sum of chunk r-s-1 to the
        // right and adds the left neighbour's partial sum of chunk r-s-2.
        // After W-1 steps chunk r holds the full sum on rank r. Each rank
        // sends (W-1)/W of the input, half of what a ring all-reduce sends.
        // Each step moves its chunk in segments, all posted at once, so the
        // additions overlap the transfer of later segments.
        const int64_t chunk_numel = chunks.size(1);
        const int64_t segment =
            std::max<int64_t>(1, kSegmentBytes / input.element_size());
        at::Tensor& scratch = impl->ring_scratch[lane_index];
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
            Wait(recvs[i], impl->timeout);
            const int64_t len = std::min(segment, chunk_numel - starts[i]);
            chunks[recv_chunk].narrow(0, starts[i], len).add_(
                incoming.narrow(0, starts[i], len));
          }
          for (auto& work : sends) Wait(work, impl->timeout);
        }
        output.view(-1).copy_(chunks[rank]);
      });
}

CommHandle ProcessGroup::all_reduce(at::Tensor tensor, ReduceOp op,
                                    Lane lane) {
  CheckContiguous(tensor, "tensor", "all_reduce");
  Impl* impl = impl_.get();
  impl->bytes_sent += 2 * tensor.nbytes() * (size() - 1) / std::max(1, size());
  internal::ShmTransport* shm = ShmFor(impl, lane, tensor);
  return RunCollective(impl, lane, "all_reduce", [impl, tensor, op, shm](auto& b) {
    if (impl->global_ranks.size() == 1) return;
    if (shm != nullptr) {
      shm->all_reduce(tensor, op);
      return;
    }
    AllReduceInPlace(b, tensor,
                     op == ReduceOp::kSum ? ::c10d::ReduceOp::SUM
                                          : ::c10d::ReduceOp::MAX,
                     impl->timeout);
  });
}

CommHandle ProcessGroup::broadcast(at::Tensor tensor, int root, Lane lane) {
  CheckContiguous(tensor, "tensor", "broadcast");
  TORCH_CHECK(root >= 0 && root < size(), "broadcast: root ", root,
              " is not a rank of a group of size ", size());
  Impl* impl = impl_.get();
  if (impl->rank == root) impl->bytes_sent += tensor.nbytes() * (size() - 1);
  internal::ShmTransport* shm = ShmFor(impl, lane, tensor);
  return RunCollective(impl, lane, "broadcast",
                       [impl, tensor, root, shm](auto& b) {
                         if (impl->global_ranks.size() == 1) return;
                         if (shm != nullptr) {
                           shm->broadcast(tensor, root);
                           return;
                         }
                         // Pure data movement: bfloat16, which Gloo 1.13
                         // rejects, travels bit for bit as float16.
                         std::vector<at::Tensor> tensors{
                             tensor.scalar_type() == at::kBFloat16
                                 ? tensor.view(at::kHalf)
                                 : tensor};
                         ::c10d::BroadcastOptions opts;
                         opts.rootRank = root;
                         Wait(b.broadcast(tensors, opts), impl->timeout);
                       });
}

CommHandle ProcessGroup::barrier(Lane lane) {
  Impl* impl = impl_.get();
  internal::ShmTransport* shm = impl->shm[static_cast<int>(lane)].get();
  return RunCollective(impl, lane, "barrier", [impl, shm](auto& b) {
    if (impl->global_ranks.size() == 1) return;
    if (shm != nullptr) {
      shm->barrier();
      return;
    }
    Wait(b.barrier(), impl->timeout);
  });
}

}  // namespace comm
}  // namespace fsdp2
