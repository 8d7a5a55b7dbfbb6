#include "core/comm/internal/shm_transport.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

bool Is16BitFloat(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16;
}

CollectiveSignature Signature(CollectiveSignature::Kind kind,
                              const at::Tensor& t, int64_t numel,
                              int64_t extra = 0) {
  CollectiveSignature s;
  s.kind = kind;
  s.dtype = static_cast<int32_t>(t.scalar_type());
  s.numel = numel;
  s.extra = extra;
  return s;
}

}  // namespace

ShmTransport::ShmTransport(std::unique_ptr<ShmSegment> segment,
                           std::unique_ptr<Transport> fallback)
    : Transport(segment->rank(), segment->world()),
      segment_(std::move(segment)),
      fallback_(std::move(fallback)) {}

void ShmTransport::in_segments(const CollectiveSignature& signature,
                               int64_t numel, int64_t segment,
                               std::initializer_list<Phase> phases) {
  if (numel == 0) segment_->sync(signature);  // nothing to move, still checked
  for (int64_t start = 0; start < numel; start += segment) {
    const int64_t len = std::min(segment, numel - start);
    for (const Phase& phase : phases) {
      phase(start, len);
      segment_->sync(signature);
    }
  }
}

int64_t ShmTransport::slot_elements(int64_t element_size) const {
  return static_cast<int64_t>(segment_->slot_bytes()) / element_size;
}

void ShmTransport::reduce_slots(int64_t offset, ReduceOp op,
                                const at::Tensor& out) const {
  const int64_t numel = out.numel();
  const auto options = out.options();
  const bool upcast = Is16BitFloat(out.scalar_type());
  at::Tensor acc = upcast ? at::empty({numel}, options.dtype(at::kFloat)) : out;
  acc.copy_(segment_->slot(0, offset, numel, options));
  for (int k = 1; k < world(); ++k) {
    at::Tensor theirs = segment_->slot(k, offset, numel, options);
    if (op == ReduceOp::kSum) {
      acc.add_(theirs);
    } else {
      at::maximum_out(acc, acc, theirs.to(acc.scalar_type()));
    }
  }
  if (upcast) out.copy_(acc);
}

void ShmTransport::all_gather_into_flat(const at::Tensor& output,
                                        const at::Tensor& input) {
  if (!output.is_cpu()) return fallback_->all_gather_into_flat(output, input);
  all_gather_flat_as_one_piece(output, input);
}

void ShmTransport::all_gather_pieces(const at::Tensor& buffer_in,
                                     const std::vector<Piece>& pieces) {
  if (!buffer_in.is_cpu()) return fallback_->all_gather_pieces(buffer_in, pieces);
  const at::Tensor buffer = buffer_in.view(-1);
  const int me = rank(), world_size = world();
  const auto options = buffer.options();
  int64_t per_rank = 0;
  for (const auto& p : pieces) per_rank += p.numel;
  // Calls fn(piece p, from element `from` of a rank's part of p, slot
  // element `at`, `n` elements) for the parts of [start, start + len) of
  // the pieces laid end to end.
  auto fragments = [&](int64_t start, int64_t len, auto&& fn) {
    int64_t virt = 0;
    for (const auto& p : pieces) {
      const int64_t lo = std::max(start, virt);
      const int64_t hi = std::min(start + len, virt + p.numel);
      if (lo < hi) fn(p, lo - virt, lo - start, hi - lo);
      virt += p.numel;
    }
  };
  auto part = [&](const Piece& p, int r, int64_t from, int64_t n) {
    return buffer.narrow(0, world_size * p.offset + r * p.numel + from, n);
  };
  in_segments(
      Signature(CollectiveSignature::kAllGather, buffer, per_rank), per_rank,
      slot_elements(buffer.element_size()),
      {[&](int64_t start, int64_t len) {  // this rank's parts into its slot
         fragments(start, len,
                   [&](const Piece& p, int64_t from, int64_t at, int64_t n) {
                     segment_->slot(me, at, n, options)
                         .copy_(part(p, me, from, n));
                   });
       },
       [&](int64_t start, int64_t len) {  // the others' parts out of theirs
         for (int k = 0; k < world_size; ++k) {
           if (k == me) continue;
           fragments(start, len,
                     [&](const Piece& p, int64_t from, int64_t at, int64_t n) {
                       part(p, k, from, n).copy_(segment_->slot(k, at, n, options));
                     });
         }
       }});
}

void ShmTransport::reduce_scatter_flat(const at::Tensor& output_in,
                                       const at::Tensor& input_in,
                                       ReduceScatterAlgorithm algorithm) {
  if (algorithm != ReduceScatterAlgorithm::kAuto || !input_in.is_cpu()) {
    return fallback_->reduce_scatter_flat(output_in, input_in, algorithm);
  }
  const at::Tensor output = output_in.view(-1), input = input_in.view(-1);
  const int64_t n = output.numel();
  // A segment holds one length-`len` stretch of every rank's chunk.
  const int64_t segment = slot_elements(input.element_size()) / world();
  TORCH_CHECK(segment > 0, "shared-memory slot too small");
  const auto options = input.options();
  in_segments(
      Signature(CollectiveSignature::kReduceScatter, input, n), n, segment,
      {[&](int64_t start, int64_t len) {  // every chunk's stretch
         for (int k = 0; k < world(); ++k) {
           segment_->slot(rank(), k * len, len, options)
               .copy_(input.narrow(0, k * n + start, len));
         }
       },
       [&](int64_t start, int64_t len) {  // this rank's chunk, summed
         reduce_slots(rank() * len, ReduceOp::kSum, output.narrow(0, start, len));
       }});
}

void ShmTransport::all_reduce(const at::Tensor& tensor_in, ReduceOp op) {
  if (!tensor_in.is_cpu()) return fallback_->all_reduce(tensor_in, op);
  const at::Tensor tensor = tensor_in.view(-1);
  const auto options = tensor.options();
  // Rank k reduces part k of each segment for everyone: [lo, lo + count).
  auto part_range = [this](int k, int64_t len) {
    const int64_t part = (len + world() - 1) / world();
    const int64_t lo = std::min(len, k * part);
    return std::make_pair(lo, std::min(len, lo + part) - lo);
  };
  in_segments(
      Signature(op == ReduceOp::kSum ? CollectiveSignature::kAllReduceSum
                                     : CollectiveSignature::kAllReduceMax,
                tensor, tensor.numel()),
      tensor.numel(), slot_elements(tensor.element_size()),
      {[&](int64_t start, int64_t len) {  // the segment into this rank's slot
         segment_->slot(rank(), 0, len, options)
             .copy_(tensor.narrow(0, start, len));
       },
       [&](int64_t start, int64_t len) {  // this rank's part, reduced
         const auto [lo, count] = part_range(rank(), len);
         if (count == 0) return;
         at::Tensor reduced = at::empty({count}, options);
         reduce_slots(lo, op, reduced);
         // Only this rank reads this part of its own slot, and it is done.
         segment_->slot(rank(), lo, count, options).copy_(reduced);
       },
       [&](int64_t start, int64_t len) {  // every rank's reduced part
         for (int k = 0; k < world(); ++k) {
           const auto [lo, count] = part_range(k, len);
           if (count > 0) {
             tensor.narrow(0, start + lo, count)
                 .copy_(segment_->slot(k, lo, count, options));
           }
         }
       }});
}

void ShmTransport::broadcast(const at::Tensor& tensor_in, int root) {
  if (!tensor_in.is_cpu()) return fallback_->broadcast(tensor_in, root);
  const at::Tensor tensor = tensor_in.view(-1);
  const auto options = tensor.options();
  in_segments(Signature(CollectiveSignature::kBroadcast, tensor, tensor.numel(), root),
              tensor.numel(), slot_elements(tensor.element_size()),
              {[&](int64_t start, int64_t len) {  // the root writes
                 if (rank() == root) {
                   segment_->slot(root, 0, len, options)
                       .copy_(tensor.narrow(0, start, len));
                 }
               },
               [&](int64_t start, int64_t len) {  // the others read
                 if (rank() != root) {
                   tensor.narrow(0, start, len)
                       .copy_(segment_->slot(root, 0, len, options));
                 }
               }});
}

void ShmTransport::barrier() { segment_->sync(); }

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
