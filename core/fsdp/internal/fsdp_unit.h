// fsdp2/core/fsdp/internal/fsdp_unit.h
//
// FSDPUnit: the state fully_shard() attaches to one module (PyTorch: the
// per-module FSDPState), and the FSDP2 protocol that fsdp::forward() and the
// autograd engine drive through it:
//
//   pre_forward    (the root first starts the pass) all-gather, prefetch the
//                  next unit, attach the backward node that will receive
//                  the unsharded gradients
//   post_forward   reshard if asked, hook pre_backward onto the outputs;
//                  the root's ends the pass
//   pre_backward   all-gather again if resharded, prefetch the unit whose
//                  backward comes next
//   post_backward  (all gradients of the unit are ready) free the unsharded
//                  parameters, hand the reduction input to the root, which
//                  reduces on the gradient lane in canonical order
//   end_backward   (the root's end-of-backward callback) finish the
//                  reduction, reshard, forget this backward's nodes
//
// The unit's parameters and their communication are its FSDPParamGroup
// (fsdp_param_group.h); what spans the module tree (the order of the
// collectives, which is the same on every rank also when some ranks do not
// call some units, prefetch, reductions in flight, end of backward) is the
// root's FSDPRootState (fsdp_root_state.h), which the first unit a forward
// enters creates.
//
// Lifetime: fully_shard's registry owns a unit while its module lives. The
// autograd nodes a unit attaches (PostBackward, PreBackward) hold it weakly:
// once the unit is gone they do nothing.
//
// Internal to core/fsdp: users reach it through fully_shard.h. Not
// thread-safe: one training thread per process.
#ifndef FSDP2_CORE_FSDP_INTERNAL_FSDP_UNIT_H_
#define FSDP2_CORE_FSDP_INTERNAL_FSDP_UNIT_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <unordered_set>
#include <vector>

#include "core/fsdp/fsdp_options.h"
#include "core/fsdp/internal/fsdp_param.h"
#include "core/fsdp/internal/fsdp_param_group.h"
#include "core/fsdp/internal/fsdp_root_state.h"
#include "core/fsdp/internal/ignored_params.h"

namespace fsdp2 {
namespace fsdp {

class FSDPUnit : public std::enable_shared_from_this<FSDPUnit> {
 public:
  // Shards `params` (collected from `module`'s tree) as `options` say; see
  // FSDPParamGroup for the errors. `ignored`: the ignored parameters in the
  // unit's part of the tree, which its forward casts with the policy
  // (ignored_params.h).
  FSDPUnit(const std::shared_ptr<torch::nn::Module>& module,
           const FSDPOptions& options, std::vector<FSDPParam> params,
           std::vector<at::Tensor> ignored = {});

  // ---- the protocol (see the file comment)
  // Throws std::logic_error while the parameters are deferred (on meta).
  void pre_forward();
  // `t` cast to param_dtype when the policy asks for it.
  at::Tensor cast_input(const at::Tensor& t) const;
  std::vector<at::Tensor> post_forward(std::vector<at::Tensor> outputs);
  void abort_forward();  // the forward threw: reshard, leave nothing half-done
  void pre_backward();
  // `node` is the node that received the gradients; stale nodes are ignored.
  // Takes the gradients: each is released as soon as it has been copied
  // into the reduction buffer.
  void post_backward(const torch::autograd::Node* node,
                     std::vector<at::Tensor> unsharded_grads);
  void end_backward();

  // ---- activation checkpointing (activation_checkpoint.h)
  // This forward is checkpointed: backward recomputes it inside this unit's
  // backward. pre_backward then unshards this unit and finishes the
  // reductions in flight (the last one's buffer is then idle, and the
  // recomputation borrows it: RecomputeArena), but leaves the operations
  // after its all-gather to post_recompute() (reductions) and post_backward
  // (the next unit's all-gather, the prefetch), so that the recomputed
  // activations and their gradients are never alive beside a second unit's
  // parameters (issue #14: peak RSS with activation checkpointing). The
  // operations keep their order, the same on every rank; they are only
  // issued later.
  void defer_backward_prefetch() { defer_backward_prefetch_ = true; }
  // The recomputation of this unit's forward is done (its backward comes
  // next): issue the reductions pre_backward left.
  void post_recompute();

  // The ignored parameters in the unit's part of the tree (each once).
  const std::vector<at::Tensor>& ignored_params() const { return ignored_.params(); }

  FSDPParamGroup& param_group() { return group_; }
  const FSDPParamGroup& param_group() const { return group_; }
  torch::nn::Module* module() const { return module_; }
  bool module_alive() const { return !module_alive_.expired(); }

  // ---- for FSDPRootState
  // The unit's turn in a forward that does not call it on this rank:
  // all-gather as if it ran (`grad`: gradients enabled in the pass), and
  // reshard as its post_forward would. Nothing where unsharding does not
  // communicate.
  void skip_forward(bool grad);
  // Whether this backward will run the unit's pre-backward (post-backward)
  // node: it is in `graph`, the nodes of the running backward (null: not
  // known; then whether the unit has such a node at all).
  bool pre_backward_in(
      const std::unordered_set<torch::autograd::Node*>* graph) const;
  bool post_backward_in(
      const std::unordered_set<torch::autograd::Node*>* graph) const;

  // ---- explicit prefetch (fsdp::set_modules_to_forward_prefetch and
  // set_modules_to_backward_prefetch): the units this unit all-gathers when
  // its forward (backward) begins, in place of the depth. Null: none set.
  void set_prefetch_list(bool forward, std::vector<std::weak_ptr<FSDPUnit>> units);
  const std::vector<std::weak_ptr<FSDPUnit>>* prefetch_list(bool forward) const;

 private:
  std::shared_ptr<FSDPRootState> init_as_root();
  // After this unit's forward, run or skipped (`grad`: gradients enabled in
  // the pass): reshard fully without gradients, else as the options say
  // (fully, down to the block group, or not at all).
  void reshard_after_pass(bool grad);
  void attach_grad_node();

  torch::nn::Module* module_;
  std::weak_ptr<torch::nn::Module> module_alive_;
  FSDPOptions options_;
  bool reshard_after_forward_ = true;
  FSDPParamGroup group_;
  std::vector<size_t> grad_params_;  // params that require grad: node inputs
  // Cast for this unit's forward and backward under a mixed-precision
  // policy: from pre_forward to end_backward (or the end of a forward
  // without gradients).
  IgnoredParams ignored_;

  // Backward state for the current step.
  std::shared_ptr<torch::autograd::Node> grad_node_;
  // The pre-backward nodes this step's forwards hooked onto the outputs.
  std::vector<std::weak_ptr<torch::autograd::Node>> pre_backward_nodes_;
  bool grad_node_fired_ = false;
  bool pre_backward_done_ = false;
  bool defer_backward_prefetch_ = false;  // see defer_backward_prefetch()
  std::optional<std::vector<std::weak_ptr<FSDPUnit>>> forward_list_;
  std::optional<std::vector<std::weak_ptr<FSDPUnit>>> backward_list_;

  // Set at the first forward: the root owns its FSDPRootState, every unit
  // of its tree (the root too) points at it.
  std::shared_ptr<FSDPRootState> root_state_;  // the root only
  std::weak_ptr<FSDPRootState> root_;
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_FSDP_UNIT_H_
