#include "core/comm/process_group.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "core/comm/internal/process_group_impl.h"

namespace fsdp2 {
namespace comm {
namespace {

// A bad argument of a collective: InvalidArgumentError with the pieces of
// `message` streamed together.
template <typename... Parts>
void CheckArgument(bool ok, const Parts&... message) {
  if (ok) return;
  std::ostringstream s;
  (s << ... << message);
  throw InvalidArgumentError(s.str());
}

void CheckContiguous(const at::Tensor& t, const char* what, const char* op) {
  CheckArgument(t.defined() && t.is_contiguous(), op, ": ", what,
                " must be a defined, contiguous tensor");
}

// Bytes sent by every group of this process, by the kind of transport.
std::mutex sent_mu;
std::map<std::string, int64_t>& SentByTransport() {
  static std::map<std::string, int64_t> sent;
  return sent;
}

void CountSent(ProcessGroup::Impl& impl, Lane lane, int64_t bytes) {
  impl.bytes_sent += bytes;
  std::lock_guard<std::mutex> lock(sent_mu);
  SentByTransport()[impl.transports[static_cast<int>(lane)]->kind()] += bytes;
}

// The lane's stream on `device`, taken from the device's pool the first time.
c10::Stream LaneStream(ProcessGroup::Impl& impl, Lane lane, const c10::Device& device) {
  std::lock_guard<std::mutex> lock(impl.streams_mu);
  auto& stream = impl.streams[static_cast<int>(lane)];
  if (!stream || stream->device() != device) {
    stream = c10::impl::VirtualGuardImpl(device.type())
                 .getStreamFromGlobalPool(device, /*isHighPriority=*/true);
  }
  return *stream;
}

// Runs `body` (a call of the lane's transport) as collective `op` on
// `lane`, rethrowing any failure with the rank, collective and group in the
// message: an fsdp2::Error keeps its code (a timeout stays a timeout), any
// other failure is a CommunicationError.
//
// The lanes of a group with one communicator (NCCL) issue to it in the
// order of the calls here, which every rank makes alike.
//
// On device tensors (a GPU), as PyTorch's FSDP2 orders its collectives: the
// lane's worker runs `body` on the lane's own stream, which first waits for
// what the calling thread's stream had queued when the collective was
// issued (so the next unit's all-gather overlaps this unit's compute, and a
// reduce-scatter the earlier units' backward); wait() orders the waiting
// thread's stream after the collective. The tensors are recorded on the
// lane's stream, so the caching allocator does not hand their memory out
// again before the collective is done with it.
CommHandle RunCollective(ProcessGroup::Impl& impl, Lane lane, const char* op,
                         std::vector<at::Tensor> tensors,
                         std::function<void(internal::Transport&)> body) {
  const bool on_device = !tensors.empty() && tensors[0].defined() &&
                         !tensors[0].is_cpu() && !tensors[0].is_meta();
  if (on_device) {
    const c10::Device device = tensors[0].device();
    const c10::impl::VirtualGuardImpl guard(device.type());
    const c10::Stream stream = LaneStream(impl, lane, device);
    auto issued = std::make_shared<c10::Event>(device.type());
    issued->record(guard.getStream(device));
    auto done = std::make_shared<c10::Event>(device.type());
    body = [body = std::move(body), tensors = std::move(tensors), stream, issued,
            done](internal::Transport& transport) {
      const c10::StreamGuard on_lane(stream);
      issued->block(stream);
      const c10::impl::VirtualGuardImpl lane_guard(stream.device_type());
      for (const auto& t : tensors) {
        if (t.defined()) lane_guard.recordDataPtrOnStream(t.storage().data_ptr(), stream);
      }
      body(transport);
      done->record(stream);
    };
    CommHandle handle = RunCollective(impl, lane, op, {}, std::move(body));
    return CommHandle(handle.future(), [done, device] {
      done->block(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
    });
  }
  internal::Transport* transport =
      impl.transports[static_cast<int>(lane)].get();
  std::string where = [&] {
    std::ostringstream s;
    s << "fsdp2: rank " << impl.world_rank << " (rank " << impl.rank << " of "
      << impl.global_ranks.size() << " in group '" << impl.name
      << "'): " << op << " failed: ";
    return s.str();
  }();
  const internal::PeerCheck* peers = &impl.peer_check;
  // Lanes sharing one communicator issue in the order the collectives were
  // issued here (internal/issue_order.h): the ticket is taken last, with
  // the queueing, so that every ticket taken reaches its lane in order.
  internal::IssueTurns* turns = transport->issue_turns();
  std::unique_lock<std::mutex> issuing(impl.issue_mu, std::defer_lock);
  if (turns != nullptr) issuing.lock();
  const int64_t ticket = turns != nullptr ? turns->issue_order()->Take() : -1;
  return impl.lanes[static_cast<int>(lane)]->submit(
      [transport, turns, peers, op, ticket, body = std::move(body), where = std::move(where)] {
        // What the store says of the group's peers, after the failure.
        auto lost = [peers, op](const std::string& what) {
          return peers->store ? "; " + peers->Describe(std::string(op) + ": " + what)
                              : std::string();
        };
        try {
          try {
            if (turns != nullptr) turns->set_ticket(ticket);
            body(*transport);
          } catch (...) {
            // A failure before the turn was taken: take and release it now,
            // before asking the store, so the collectives behind it go on.
            if (turns != nullptr) turns->turn_unused_ticket();
            throw;
          }
          if (turns != nullptr) turns->turn_unused_ticket();
        } catch (const Error& e) {
          ThrowError(e.code(), where + e.what() + lost(e.what()));
        } catch (const c10::Error& e) {
          throw CommunicationError(where + e.what_without_backtrace() +
                                   lost(e.what_without_backtrace()));
        } catch (const std::exception& e) {
          throw CommunicationError(where + e.what() + lost(e.what()));
        }
      });
}

}  // namespace

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

ProcessGroup::~ProcessGroup() {
  // Stop the workers (draining queued work) before the transports go.
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
std::string ProcessGroup::backend() const { return impl_->backend; }
std::chrono::milliseconds ProcessGroup::timeout() const {
  return impl_->timeout;
}
int64_t ProcessGroup::bytes_sent() const { return impl_->bytes_sent.load(); }

std::map<std::string, int64_t> BytesSentByTransport() {
  std::lock_guard<std::mutex> lock(sent_mu);
  return SentByTransport();
}

CommHandle ProcessGroup::submit(Lane lane, std::function<void()> fn) {
  return impl_->lanes[static_cast<int>(lane)]->submit(std::move(fn));
}

CommHandle ProcessGroup::all_gather_into_flat(at::Tensor output,
                                              at::Tensor input, Lane lane) {
  CheckContiguous(output, "output", "all_gather_into_flat");
  CheckContiguous(input, "input", "all_gather_into_flat");
  const int world = size();
  CheckArgument(output.numel() == input.numel() * world,
              "all_gather_into_flat: output has ", output.numel(),
              " elements, expected ", world, " x ", input.numel());
  CheckArgument(output.scalar_type() == input.scalar_type(),
              "all_gather_into_flat: dtypes differ");
  CountSent(*impl_, lane, input.nbytes() * (world - 1));
  return RunCollective(*impl_, lane, "all_gather", {output, input},
                       [output, input](internal::Transport& transport) {
                         transport.all_gather_into_flat(output, input);
                       });
}

CommHandle ProcessGroup::all_gather_pieces(at::Tensor buffer,
                                           std::vector<Piece> pieces,
                                           Lane lane) {
  CheckContiguous(buffer, "buffer", "all_gather_pieces");
  const int world = size();
  int64_t per_rank = 0;
  for (const auto& p : pieces) {
    CheckArgument(p.offset >= 0 && p.numel >= 0 &&
                    world * (p.offset + p.numel) <= buffer.numel(),
                "all_gather_pieces: piece [", p.offset, ", +", p.numel,
                ") does not fit a buffer of ", buffer.numel(), " elements");
    per_rank += p.numel;
  }
  CountSent(*impl_, lane, per_rank * buffer.element_size() * (world - 1));
  return RunCollective(
      *impl_, lane, "all_gather", {buffer},
      [buffer, pieces = std::move(pieces)](internal::Transport& transport) {
        transport.all_gather_pieces(buffer, pieces);
      });
}

CommHandle ProcessGroup::reduce_scatter_flat(at::Tensor output,
                                             at::Tensor input, Lane lane,
                                             ReduceScatterAlgorithm algorithm) {
  CheckContiguous(output, "output", "reduce_scatter_flat");
  CheckContiguous(input, "input", "reduce_scatter_flat");
  const int world = size();
  CheckArgument(input.numel() == output.numel() * world,
              "reduce_scatter_flat: input has ", input.numel(),
              " elements, expected ", world, " x ", output.numel());
  CheckArgument(output.scalar_type() == input.scalar_type(),
              "reduce_scatter_flat: dtypes differ");
  const bool use_all_reduce = algorithm == ReduceScatterAlgorithm::kAllReduce;
  CountSent(*impl_, lane, output.nbytes() * (world - 1) * (use_all_reduce ? 2 : 1));
  return RunCollective(
      *impl_, lane, "reduce_scatter", {output, input},
      [output, input, algorithm](internal::Transport& transport) {
        transport.reduce_scatter_flat(output, input, algorithm);
      });
}

CommHandle ProcessGroup::all_reduce(at::Tensor tensor, ReduceOp op,
                                    Lane lane) {
  CheckContiguous(tensor, "tensor", "all_reduce");
  CountSent(*impl_, lane, 2 * tensor.nbytes() * (size() - 1) / std::max(1, size()));
  return RunCollective(*impl_, lane, "all_reduce", {tensor},
                       [tensor, op](internal::Transport& transport) {
                         transport.all_reduce(tensor, op);
                       });
}

CommHandle ProcessGroup::broadcast(at::Tensor tensor, int root, Lane lane) {
  CheckContiguous(tensor, "tensor", "broadcast");
  CheckArgument(root >= 0 && root < size(), "broadcast: root ", root,
              " is not a rank of a group of size ", size());
  if (impl_->rank == root) CountSent(*impl_, lane, tensor.nbytes() * (size() - 1));
  return RunCollective(*impl_, lane, "broadcast", {tensor},
                       [tensor, root](internal::Transport& transport) {
                         transport.broadcast(tensor, root);
                       });
}

CommHandle ProcessGroup::barrier(Lane lane) {
  return RunCollective(
      *impl_, lane, "barrier", {},
      [](internal::Transport& transport) { transport.barrier(); });
}

}  // namespace comm
}  // namespace fsdp2
