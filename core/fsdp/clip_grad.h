// fsdp2/core/fsdp/clip_grad.h
//
// Gradient clipping for a sharded model (torch::nn::utils::clip_grad_norm_
// over the unsharded model): the global norm counts every element of every
// parameter once, the shards summed over their shard groups. Tensor
// parallelism names its split parameters here (core/tp/clip_grad.h).
// fully_shard.h includes this header.
//
// Thread-safety: as fully_shard.h (one training thread per process).
#ifndef FSDP2_CORE_FSDP_CLIP_GRAD_H_
#define FSDP2_CORE_FSDP_CLIP_GRAD_H_

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <unordered_set>

#include "core/comm/process_group.h"

namespace fsdp2 {
namespace fsdp {

// Parameters whose local tensor is one block of a tensor split over `group`
// (tensor parallelism, see core/tp): clip_grad_norm_ sums their norms over
// `group`. Every other parameter is the same on each rank of `group` and
// counts once.
struct SplitParameters {
  std::shared_ptr<comm::ProcessGroup> group;  // null or size 1: none split
  std::unordered_set<std::string> names;  // as root.named_parameters() names them
};

// Clips the gradients of every parameter under `root` (the local shards'
// .grad) so that their global norm is at most `max_norm`, like
// torch::nn::utils::clip_grad_norm_ on the unsharded model: every element
// of every parameter counts once (tied parameters too), shards summed over
// their shard groups, `split` blocks over split.group, parameters outside
// FSDP as this rank holds them. norm_type may be infinity. Returns the
// global norm before clipping. Collective over the shard groups and
// split.group.
double clip_grad_norm_(torch::nn::Module& root, double max_norm,
                       double norm_type = 2.0,
                       const SplitParameters& split = {});

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_CLIP_GRAD_H_
