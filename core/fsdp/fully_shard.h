// fsdp2/core/fsdp/fully_shard.h
//
// fully_shard(): FSDP2-style fully sharded data parallelism for LibTorch
// modules.
//
// Usage, bottom-up, then the root; optimizers are created afterwards:
//
//   for (auto& block : *model->blocks) fsdp::fully_shard(block, options);
//   fsdp::fully_shard(model, options);
//   torch::optim::AdamW opt(model->parameters(), ...);  // sees local shards
//   auto logits = fsdp::forward(model, tokens);          // not model->forward
//   loss.backward();                                     // grads reduced
//   opt.step();
//
// What fully_shard does to a module:
//  - Each parameter it owns (those of the module's subtree that no inner
//    sharded module owns) is split along dim 0 into one chunk per rank of the
//    shard group; rank r keeps chunk r (trailing ranks may hold fewer or no
//    rows). The module's registered parameter becomes that local shard, so
//    named_parameters() shows the original names with sharded values and a
//    stock torch::optim optimizer holds sharded state.
//  - The module's own tensor members (e.g. LinearImpl::weight) become compute
//    tensors that hold the full parameter only while it is unsharded.
//
// C++ modules have no forward hooks, so a sharded module must be called
// through fsdp::forward(module, args...): it all-gathers the parameters
// before the module runs, frees them afterwards (reshard_after_forward),
// and arranges for the backward pass to all-gather again, reduce-scatter the
// gradients into the shards' .grad and free the unsharded storage. Modules
// inside a sharded module that are not sharded themselves are called as
// usual. Calling a resharded module directly fails with a shape error.
//
// A module marked with checkpoint_module() (activation_checkpoint.h) is
// recomputed in backward instead of keeping its activations.
//
// Sharded modules that run on only some ranks (an expert that gets no rows
// on a rank, an early exit, a data-dependent branch, an output that reaches
// the loss on some ranks only) train as one process would on the global
// batch: every rank issues the same collectives in the same order, in the
// order of the module tree, whatever it calls; a parameter gets a gradient
// when some rank's loss reached it, and none (.grad as it was) when no
// rank's did. A regular model (every rank calls every sharded module, in
// the order they are registered) pays nothing for this. Where ranks skip
// modules, each skipped module costs its all-gather(s) and a reduction of
// zeros on the ranks that skip it. A sharded module called a second time in
// one forward, or after a module registered after it, all-gathers where it
// is called: every rank must then make that call at the same point.
// Every rank's loss must depend on the root module's output.
//
// Thread-safety: one training thread per process. The backward pass must be
// run with Tensor::backward() / torch::autograd::backward (not
// torch::autograd::grad) and without retain_graph.
//
// This header also brings in what is used with sharded modules, each in a
// file of its own: gradient clipping (clip_grad.h), full state dicts and
// each parameter's rows (state_dict.h), memory and communication statistics
// (stats.h), and the options (fsdp_options.h, mixed_precision.h).
// forward()'s templates are in forward_detail.h.
#ifndef FSDP2_CORE_FSDP_FULLY_SHARD_H_
#define FSDP2_CORE_FSDP_FULLY_SHARD_H_

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "core/comm/device_mesh.h"
#include "core/comm/process_group.h"
#include "core/fsdp/activation_checkpoint.h"
#include "core/fsdp/clip_grad.h"
#include "core/fsdp/fsdp_options.h"
#include "core/fsdp/mixed_precision.h"
#include "core/fsdp/offload.h"
#include "core/fsdp/state_dict.h"
#include "core/fsdp/stats.h"

namespace fsdp2 {
namespace fsdp {

// The state fully_shard() attaches to a module: an opaque handle here (the
// engine is core/fsdp/internal/, starting at fsdp_unit.h).
class FSDPUnit;

// Shards `module` (see the file comment). Throws std::invalid_argument if the
// module is already sharded, the options do not fit the mesh, its parameters
// are on different devices, or one of its parameters is tied to a parameter
// that another sharded module owns. A module with no parameters of its own is
// allowed and communicates nothing. Deferred parameters (built under a
// DeferredInitGuard, see deferred_init.h) are sharded by shape and stay on
// meta until materialize_module(); std::logic_error inside a guard.
std::shared_ptr<FSDPUnit> fully_shard(
    const std::shared_ptr<torch::nn::Module>& module,
    const FSDPOptions& options);

// The same for a module holder (e.g. a model's TORCH_MODULE type): shards
// the module it holds.
template <typename Impl>
std::shared_ptr<FSDPUnit> fully_shard(
    const torch::nn::ModuleHolder<Impl>& module, const FSDPOptions& options) {
  return fully_shard(std::static_pointer_cast<torch::nn::Module>(module.ptr()),
                     options);
}

// The unit fully_shard made of `module`, or nullptr (also for a module
// built where a sharded module that has since died used to live).
std::shared_ptr<FSDPUnit> unit_of(const torch::nn::Module& module);

// Turns gradient reduction on or off for every sharded module under `root`.
// Off: backward accumulates unsharded gradients locally (no communication);
// the next backward with it on reduces them together with its own.
void set_requires_gradient_sync(torch::nn::Module& root, bool sync);

// For HYBRID_SHARD (and NO_SHARD) under gradient accumulation, with
// gradient sync on: off, each backward reduce-scatters its gradients inside
// the shard group (so the unsharded gradients are freed at once: memory of
// one unit's gradients, not the whole model's) and keeps the result as a
// running sharded sum (memory: one sharded gradient per unit), but does not
// all-reduce across the replicas (the slow links between hosts); the next
// backward with it on all-reduces that sum together with its own, once, and
// writes the shards' .grad. Costs one reduce-scatter per micro-batch inside
// the shard group. Without replicas it changes nothing (every reduction
// writes the shards' .grad). Collective: every rank sets the same.
void set_requires_all_reduce(torch::nn::Module& root, bool all_reduce);

// Sets FSDPOptions::gradient_divide_factor for every sharded module under
// `root` (1: sum). Throws std::invalid_argument unless `factor` > 0.
void set_gradient_divide_factor(torch::nn::Module& root, double factor);

// CPU offload (OffloadPolicy): hands each unit's reduced gradients under
// `root`, copied to host memory, to `sink` (core/fsdp/offload.h) instead of
// adding them to the shards' .grad before the reduction returns; null
// restores that. Units without offload ignore it.
void set_host_gradient_sink(torch::nn::Module& root, HostGradientSink sink);

// An all-gather started by unshard(module, /*async_op=*/true).
class UnshardHandle {
 public:
  UnshardHandle() = default;
  // A handle on `unit`'s all-gather in flight (unshard() makes it); it does
  // not keep the unit alive.
  explicit UnshardHandle(std::weak_ptr<FSDPUnit> unit);
  // Waits for the all-gather; the module's parameters are then whole.
  // Once; later calls (and a handle on a dead module) do nothing.
  void wait();

 private:
  std::weak_ptr<FSDPUnit> unit_;
};

// All-gathers `module`'s parameters ahead of its forward (PyTorch's
// FSDPModule.unshard), e.g. to overlap them with work of your own before
// the model runs: forward then finds them gathered, and reshards after it
// as the options say. async_op: return at once, wait() on the handle
// (forward also waits). Collective over the module's shard group: every
// rank makes the same calls in the same order. Throws
// std::invalid_argument if `module` is not sharded, std::logic_error while
// its parameters are deferred.
UnshardHandle unshard(const torch::nn::Module& module, bool async_op = false);
// Frees `module`'s unsharded parameters (waiting for an all-gather in
// flight); nothing if sharded. Throws std::invalid_argument if `module` is
// not sharded.
void reshard(const torch::nn::Module& module);

// Explicit prefetch lists (PyTorch's FSDPModule.set_modules_to_forward_
// prefetch / set_modules_to_backward_prefetch): when `module`'s forward
// (backward) begins, all-gather `modules` as well, in this order, in place
// of the forward_prefetch (backward_prefetch) depth for `module`; an empty
// list prefetches nothing from it. Each listed unit costs its parameters
// held from `module`'s turn to its own; it saves that unit's exposed
// all-gather wait. The backward lists may run past the depth (no cap).
// Listed modules must be sharded, under the same root as `module`, and
// come after it in the pass (forward: the module tree's pre-order, which
// is the order fsdp runs forward all-gathers in; backward: the reverse,
// children last first): check_prefetch_lists() verifies that, and the
// root's first forward (FSDP2Strategy::parallelize() calls it). Every rank
// must set the same lists. Throws std::invalid_argument if `module` or one
// of `modules` is not sharded, or `modules` lists `module` itself or one
// module twice.
void set_modules_to_forward_prefetch(
    const torch::nn::Module& module,
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules);
// The backward list of `module`, as described above: all-gathered, in this
// order, when `module`'s backward begins.
void set_modules_to_backward_prefetch(
    const torch::nn::Module& module,
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules);
// Throws std::invalid_argument, naming the unit and the module, where a
// prefetch list of a unit under `root` names a module that no longer
// exists, a unit of another root (not under `root`), or one that its pass
// reaches before it.
void check_prefetch_lists(torch::nn::Module& root);

// Runs module->forward(args...) under FSDP: unshards before, reshards after
// and hooks the backward pass. A module that is not sharded just runs.
// Tensor arguments are cast to param_dtype when the policy asks for it. A
// module marked with checkpoint_module() runs as a checkpointed region
// (activation_checkpoint.h), sharded or not.
template <typename M, typename... Args>
auto forward(M module, Args&&... args);

}  // namespace fsdp
}  // namespace fsdp2

// The definition of forward() and the templates behind it.
#include "core/fsdp/forward_detail.h"

#endif  // FSDP2_CORE_FSDP_FULLY_SHARD_H_
