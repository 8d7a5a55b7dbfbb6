// fsdp2/core/tp/clip_grad.h
//
// Gradient clipping for a model that is tensor-parallel and FSDP-sharded:
// the global norm counts every element of every parameter once, as
// torch::nn::utils::clip_grad_norm_ would on the unsplit model. A
// tensor-parallel parameter's blocks are summed over the tensor-parallel
// ranks; a replicated one (LayerNorms, embeddings left out of the plan, a
// row-wise bias), whose gradient is the same on every tensor-parallel rank,
// is counted once. FSDP shards are summed over their shard groups. The one
// implementation is fsdp::clip_grad_norm_; this names the tensor-parallel
// parameters for it.
#ifndef FSDP2_CORE_TP_CLIP_GRAD_H_
#define FSDP2_CORE_TP_CLIP_GRAD_H_

#include <torch/nn/module.h>

#include "core/fsdp/clip_grad.h"

namespace fsdp2 {
namespace tp {

// Scales the gradients of every parameter under `root` (the local shards'
// .grad) so that the global norm is at most `max_norm`; returns the norm
// before clipping. norm_type may be infinity. Collective over the
// tensor-parallel group and the FSDP shard groups. Without tensor-parallel
// parameters it is fsdp::clip_grad_norm_. Throws std::invalid_argument when
// the tensor-parallel layers use different groups. `parts`: gradients'
// shares of the norm taken ahead (fsdp::GradNormParts), or null.
double clip_grad_norm_(torch::nn::Module& root, double max_norm,
                       double norm_type = 2.0,
                       const fsdp::GradNormParts* parts = nullptr);

}  // namespace tp
}  // namespace fsdp2

#endif  // FSDP2_CORE_TP_CLIP_GRAD_H_
