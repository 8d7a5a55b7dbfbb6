// fsdp2/core/checkpoint/internal/param_layout.h
//
// Where each parameter of a parallelized model lives, for checkpoints that
// hold every parameter under its original name and full shape whatever the
// (dp, tp) layout: tensor parallelism (core/tp) splits a parameter into
// blocks along a dim, then FSDP shards this rank's block by rows.
#ifndef FSDP2_CORE_CHECKPOINT_INTERNAL_PARAM_LAYOUT_H_
#define FSDP2_CORE_CHECKPOINT_INTERNAL_PARAM_LAYOUT_H_

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/nn/module.h>

#include <vector>

#include "core/fsdp/fully_shard.h"
#include "core/tp/parallelize.h"

namespace fsdp2 {
namespace checkpoint {
namespace internal {

struct ParamLayout {
  // FSDP's view: this rank's rows of its tensor-parallel block (global_shape
  // is the block's shape), or of the whole parameter without TP.
  fsdp::ShardInfo shard;
  c10::optional<tp::ShardedParameter> tp;  // set for tensor-parallel parameters
  std::vector<int64_t> full_shape;         // the parameter as the model built it
  // Whether this rank writes its FSDP rows into a sharded checkpoint: the
  // primary replica, and of parameters replicated over tensor-parallel
  // ranks only tensor-parallel rank 0's copy.
  bool writes_rows = true;
};

// Every parameter of `root`, in named_parameters() order.
std::vector<ParamLayout> ParamLayouts(torch::nn::Module& root, int world_rank);

// The full parameter from a tensor shaped like this rank's shard (the shard
// itself or optimizer state). Collective over the FSDP shard group and, for
// tensor-parallel parameters, the tensor-parallel group.
at::Tensor GatherFull(const ParamLayout& layout, const at::Tensor& local);

// This rank's shard (shaped like layout.shard.shard) of a full tensor.
at::Tensor LocalOfFull(const ParamLayout& layout, const at::Tensor& full);

// Whether a file's rows of the parameter can be read straight into its
// shard: FSDP rows only (not a tensor-parallel block, not 0-d), held
// contiguously in CPU memory.
bool RowsReadInPlace(const ParamLayout& layout);

}  // namespace internal
}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_INTERNAL_PARAM_LAYOUT_H_
