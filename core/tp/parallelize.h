// fsdp2/core/tp/parallelize.h
//
// parallelize_module(): applies a TensorParallelPlan (core/tp/plan.h) to a
// model of stock torch::nn::Linear / torch::nn::Embedding modules, and
// tp::forward(), through which a model calls those modules.
//
// What parallelize_module does to each module the plan names: its weight
// (and bias) become this rank's block, in place (the same tensor object, so
// module members, named_parameters() and later fully_shard() see the local
// block), and the module is registered as tensor-parallel. Names never
// change; shapes become local.
//
// C++ modules have no forward hooks, so a model calls its layers through
// tp::forward(layer, x): a tensor-parallel layer runs its style's forward
// (collectives included); any other module just runs module->forward(x).
// Models written this way run unchanged with and without tensor parallelism.
//
// Order: tensor parallelism first, then fully_shard over the data-parallel
// ranks (FSDP then shards the local blocks). parallelize_module refuses a
// model that already has sharded modules.
#ifndef FSDP2_CORE_TP_PARALLELIZE_H_
#define FSDP2_CORE_TP_PARALLELIZE_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/tp/plan.h"

namespace fsdp2 {
namespace tp {

// Collective-free, but every rank of `group` must apply the same plan to the
// same model (their parameters are assumed equal before the split). Throws
// std::invalid_argument naming the module when a plan entry matches nothing,
// names a module that is not a Linear or Embedding, a split is uneven, an
// option the style cannot honour is set (Embedding max_norm, sparse, or
// padding_idx with a row-wise split), a module is already tensor-parallel,
// or the model already has FSDP-sharded modules.
void parallelize_module(const std::shared_ptr<torch::nn::Module>& root,
                        const std::shared_ptr<comm::ProcessGroup>& group,
                        const TensorParallelPlan& plan);

// Whether parallelize_module split `module`.
bool is_tensor_parallel(const torch::nn::Module& module);

// A parameter that tensor parallelism split: its full value is the rank
// blocks of `dim` put back together (see full_from_local / local_from_full).
struct ShardedParameter {
  std::string name;  // as root.named_parameters() names it
  int64_t dim = 0;  // the split dim (Linear: 0 column-wise, 1 row-wise; Embedding: reverse)
  int64_t fused_parts = 1;  // fused blocks split separately (ParallelStyle)
  std::vector<int64_t> full_shape;  // before the split
  std::shared_ptr<comm::ProcessGroup> group;  // the tensor-parallel group
};

// Every tensor-parallel parameter under `root`, in module order. Parameters
// not listed are replicated over the tensor-parallel ranks.
std::vector<ShardedParameter> sharded_parameters(torch::nn::Module& root);

// The full value from this rank's block `local` (collective over p.group),
// and this rank's block of a full value (throws std::invalid_argument naming
// the parameter when `full` is not p.full_shape).
at::Tensor full_from_local(const ShardedParameter& p, const at::Tensor& local);
// This rank's block of `full`, as a new tensor; local (no communication).
at::Tensor local_from_full(const ShardedParameter& p, const at::Tensor& full);

namespace internal {
// Runs `module`'s tensor-parallel forward, or returns an undefined tensor
// when the module is not tensor-parallel.
at::Tensor Forward(torch::nn::Module* module, const at::Tensor& x);

template <typename Impl>
torch::nn::Module* ModulePtr(const torch::nn::ModuleHolder<Impl>& m) {
  return m.ptr().get();
}
}  // namespace internal

// Runs `module` (a ModuleHolder such as torch::nn::Linear) on `x`: its
// tensor-parallel forward if parallelize_module split it, else
// module->forward(x).
template <typename M>
at::Tensor forward(M module, const at::Tensor& x) {
  at::Tensor out = internal::Forward(internal::ModulePtr(module), x);
  return out.defined() ? out : module->forward(x);
}

}  // namespace tp
}  // namespace fsdp2

#endif  // FSDP2_CORE_TP_PARALLELIZE_H_
