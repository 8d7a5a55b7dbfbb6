#include "core/fsdp/internal/fsdp_collectives.h"

#include <ATen/ATen.h>

#include "core/fsdp/internal/buffer_pool.h"

namespace fsdp2 {
namespace fsdp {

std::vector<comm::ProcessGroup::Piece> CopyInForAllGather(
    const std::vector<FSDPParam>& params, const at::Tensor& unsharded,
    int world, int rank, const std::vector<at::Tensor>* sources) {
  std::vector<comm::ProcessGroup::Piece> pieces;
  pieces.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const FSDPParam& p = params[i];
    if (p.shard_numel() == 0) continue;
    p.copy_shard_to(p.chunk_of(unsharded, world, rank),
                    sources != nullptr ? (*sources)[i] : at::Tensor());
    pieces.push_back({p.flat_offset(), p.shard_numel()});
  }
  return pieces;
}

at::Tensor CopyInForReduce(const std::vector<FSDPParam>& params,
                           std::vector<at::Tensor>& grads, int world,
                           int64_t flat, bool padded,
                           const at::TensorOptions& options) {
  const int64_t n = static_cast<int64_t>(params.size());
  const int64_t width = flat + n;
  at::Tensor input = internal::BufferPool::Get().empty({world * width}, options);
  bool all_defined = true;
  std::vector<double> flags(n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    flags[i] = grads[i].defined() ? 1.0 : 0.0;
    all_defined = all_defined && grads[i].defined();
  }
  const at::Tensor by_rank = input.view({world, width});
  if (padded || !all_defined) by_rank.narrow(1, 0, flat).zero_();
  for (int64_t i = 0; i < n; ++i) {
    if (!grads[i].defined()) continue;
    params[i].copy_grad_to(grads[i], by_rank);
    grads[i] = at::Tensor();  // copied: let it go while the rest are copied
  }
  if (n > 0) {
    const at::Tensor flag_row =
        at::tensor(flags, at::TensorOptions().dtype(at::kDouble))
            .to(input.device(), input.scalar_type());
    by_rank.narrow(1, flat, n).copy_(flag_row.expand({world, n}));
  }
  return input;
}

PendingReduction ReduceGrads(
    at::Tensor input, int64_t width,
    const std::shared_ptr<comm::ProcessGroup>& shard_group,
    const std::shared_ptr<comm::ProcessGroup>& replicate_group,
    double divide_factor, at::Tensor partial) {
  TORCH_INTERNAL_ASSERT(shard_group || replicate_group,
                        "ReduceGrads: nothing to reduce over");
  TORCH_INTERNAL_ASSERT(!partial.defined() || replicate_group,
                        "ReduceGrads: a partial sum needs replicas");
  const double f = divide_factor;
  PendingReduction out;
  if (!shard_group) {
    out.output = input;
    if (partial.defined()) {
      replicate_group->submit(comm::Lane::kGradient, [output = out.output, f, partial] {
        output.div_(f).add_(partial);
      });
    }
    comm::CommHandle reduced = replicate_group->all_reduce(
        out.output, comm::ReduceOp::kSum, comm::Lane::kGradient);
    // With a partial sum the division came first; else it follows.
    out.done = partial.defined()
                   ? reduced
                   : replicate_group->submit(comm::Lane::kGradient,
                                             [output = out.output, f] { output.div_(f); });
    return out;
  }
  out.output = input.narrow(0, shard_group->rank() * width, width);
  comm::CommHandle scattered = shard_group->reduce_scatter_flat(out.output, input);
  out.done = shard_group->submit(
      comm::Lane::kGradient,
      [scattered, output = out.output, replicate = replicate_group, f, partial] {
        scattered.wait();
        if (partial.defined()) output.div_(f).add_(partial);
        if (replicate) {
          replicate->all_reduce(output, comm::ReduceOp::kSum,
                                comm::Lane::kGradient)
              .wait();
        }
        if (!partial.defined()) output.div_(f);
      });
  return out;
}

}  // namespace fsdp
}  // namespace fsdp2
