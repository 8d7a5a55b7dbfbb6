// fsdp2/core/fsdp/internal/fsdp_collectives.h
//
// The data movement around one unit's collectives (PyTorch:
// _fsdp_collectives.py): copy-in to the all-gather buffer, and the gradient
// pipeline (copy-in to the rank-major reduce-scatter input, reduce-scatter,
// all-reduce across replicas, division by the data-parallel size). The
// buffer layouts are FSDPParam's (see fsdp_param.h). Copy-out needs no copy:
// the parameters view the unsharded buffer (FSDPParam::unsharded_view).
//
// Internal to core/fsdp. Called from the training thread.
#ifndef FSDP2_CORE_FSDP_INTERNAL_FSDP_COLLECTIVES_H_
#define FSDP2_CORE_FSDP_INTERNAL_FSDP_COLLECTIVES_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "core/comm/comm_handle.h"
#include "core/comm/process_group.h"
#include "core/fsdp/internal/fsdp_param.h"

namespace fsdp2 {
namespace fsdp {

// Copy-in for the all-gather: writes every parameter's shard, zero-padded,
// into this rank's chunk of `unsharded` (world * flat elements) and returns
// the pieces ProcessGroup::all_gather_pieces fills in from the other ranks
// (a parameter with an empty chunk has none). With `sources` (CPU
// offload: the shards' copies on the device, one per parameter), those are
// read instead of the shards.
std::vector<comm::ProcessGroup::Piece> CopyInForAllGather(
    const std::vector<FSDPParam>& params, const at::Tensor& unsharded,
    int world, int rank, const std::vector<at::Tensor>* sources = nullptr);

// Copy-in for the reduction: a rank-major buffer from the engine's pool
// ([world, flat + params.size()] of `options`, returned flat). Row r holds
// what rank r receives: every defined gradient in `grads` (one per
// parameter, full size) at its parameter's place, zeros elsewhere (padding,
// undefined gradients), then one contribution flag per parameter (1: this
// rank has a gradient for it, 0: none). Summed by the reduction, the flags
// count the ranks that contributed, so that every rank learns whether a
// parameter got a gradient anywhere without a collective of its own. Each
// gradient is released as soon as it has been copied.
at::Tensor CopyInForReduce(const std::vector<FSDPParam>& params,
                           std::vector<at::Tensor>& grads, int world,
                           int64_t flat, bool padded,
                           const at::TensorOptions& options);

// A gradient reduction in flight: `output` ([width], reduce dtype; width =
// flat + the number of flags) holds this rank's reduced, averaged gradients
// and the averaged contribution flags once `done` completes. It is this
// rank's row of the reduction input, which it keeps alive.
struct PendingReduction {
  at::Tensor output;
  comm::CommHandle done;
};

// The reduction, on the gradient lane: reduce-scatter `input` ([world *
// width]) over `shard_group` (null: one shard, `input` becomes the output),
// sum over `replicate_group` (null: no replicas, or their all-reduce left
// for later), divide by `divide_factor`. At least one group is non-null.
// `partial` (defined only with a replicate group): this rank's sum of the
// earlier reductions that skipped the all-reduce, already divided; it joins
// this one's (divided) row before the all-reduce, which then sums every
// micro-batch over the replicas at once. The reduce-scatter writes into this
// rank's own row of `input` (in place), so a reduction holds one buffer,
// not an input and an output; the other rows are scratch space afterwards.
PendingReduction ReduceGrads(
    at::Tensor input, int64_t width,
    const std::shared_ptr<comm::ProcessGroup>& shard_group,
    const std::shared_ptr<comm::ProcessGroup>& replicate_group,
    double divide_factor, at::Tensor partial = at::Tensor());

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_FSDP_COLLECTIVES_H_
