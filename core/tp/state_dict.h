// fsdp2/core/tp/state_dict.h
//
// Full state dicts of a tensor-parallel (and FSDP-sharded) model: the same
// names and shapes as the model before parallelize_module, so a state dict
// saved with any (dp, tp) layout loads into any other and into a plain model.
//
// fsdp::full_state_dict() undoes the data-parallel sharding and gives each
// rank its tensor-parallel block; gather_tensor_parallel() then undoes the
// tensor-parallel split. local_state_dict() goes the other way, before
// fsdp::load_full_state_dict().
#ifndef FSDP2_CORE_TP_STATE_DICT_H_
#define FSDP2_CORE_TP_STATE_DICT_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

namespace fsdp2 {
namespace tp {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Replaces each entry of `state` that names a tensor-parallel parameter of
// `root` (holding this rank's block) by the full tensor. Collective over the
// tensor-parallel groups: every rank passes the same names in the same order.
void gather_tensor_parallel(torch::nn::Module& root, NamedTensors& state);

// `state` with each tensor-parallel entry (a full tensor) replaced by this
// rank's block; other entries are shared, not copied. Throws
// std::invalid_argument naming the parameter on a shape mismatch.
NamedTensors local_state_dict(torch::nn::Module& root, const NamedTensors& state);

}  // namespace tp
}  // namespace fsdp2

#endif  // FSDP2_CORE_TP_STATE_DICT_H_
