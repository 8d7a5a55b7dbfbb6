#include "core/fsdp/internal/fsdp_unit.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <stdexcept>

#include "core/fsdp/internal/unit_registry.h"

namespace fsdp2 {
namespace fsdp {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;

// Receives the gradients of every parameter of one unit (one input each) and
// fires once all of them are computed: the unit's post-backward.
class PostBackwardNode : public Node {
 public:
  explicit PostBackwardNode(std::weak_ptr<FSDPUnit> unit)
      : unit_(std::move(unit)) {}
  std::string name() const override { return "fsdp2::PostBackward"; }

 protected:
  variable_list apply(variable_list&& grads) override {
    if (auto unit = unit_.lock()) unit->post_backward(this, std::move(grads));
    return {};
  }

 private:
  std::weak_ptr<FSDPUnit> unit_;
};

// A weak reference to a unit that an autograd context can save.
struct WeakUnit : torch::CustomClassHolder {
  explicit WeakUnit(std::weak_ptr<FSDPUnit> u) : unit(std::move(u)) {}
  std::weak_ptr<FSDPUnit> unit;
};

// Identity on a unit's outputs whose backward runs the unit's pre-backward
// (all-gather again) before any gradient flows into the unit.
struct PreBackwardFunction
    : public torch::autograd::Function<PreBackwardFunction> {
  // `outputs` must arrive as a TensorList: a std::vector argument would be
  // taken for a non-tensor and the outputs would lose their history.
  static variable_list forward(torch::autograd::AutogradContext* ctx,
                               at::TensorList outputs,
                               std::weak_ptr<FSDPUnit> unit) {
    ctx->saved_data["unit"] =
        c10::IValue::make_capsule(c10::make_intrusive<WeakUnit>(std::move(unit)));
    return outputs.vec();
  }
  static variable_list backward(torch::autograd::AutogradContext* ctx,
                                variable_list grads) {
    auto ref = c10::static_intrusive_pointer_cast<WeakUnit>(
        ctx->saved_data["unit"].toCapsule());
    if (auto unit = ref->unit.lock()) unit->pre_backward();
    grads.emplace_back();  // for the `unit` argument
    return grads;
  }
};

}  // namespace

FSDPUnit::FSDPUnit(const std::shared_ptr<torch::nn::Module>& module,
                   const FSDPOptions& options, std::vector<FSDPParam> params,
                   std::vector<at::Tensor> ignored)
    : module_(module.get()),
      module_alive_(module),
      options_(options),
      group_(std::move(params), options),
      ignored_(std::move(ignored), options.mp_policy.param_dtype) {
  reshard_after_forward_ = options_.reshard_after_forward.value_or(
      options_.strategy == ShardingStrategy::kFullShard ||
      options_.strategy == ShardingStrategy::kHybridShard);
  if (options_.reshard_after_forward_size > 0) {
    // 1: fully; the whole shard group: not at all; else down to blocks.
    reshard_after_forward_ = options_.reshard_after_forward_size < group_.shard_world();
  }
  const auto& sharded = group_.params();
  for (size_t i = 0; i < sharded.size(); ++i) {
    if (sharded[i].requires_grad()) grad_params_.push_back(i);
  }
}

void FSDPUnit::skip_forward(bool grad) {
  if (!group_.gathers()) return;
  group_.wait_unshard();
  reshard_after_pass(grad);
}

void FSDPUnit::reshard_after_pass(bool grad) {
  if (!grad) {
    group_.reshard();
  } else if (reshard_after_forward_) {
    group_.reshard_after_forward();
  }
}

bool FSDPUnit::pre_backward_in(
    const std::unordered_set<torch::autograd::Node*>* graph) const {
  for (const auto& weak : pre_backward_nodes_) {
    auto node = weak.lock();
    if (node && (graph == nullptr || graph->count(node.get()))) return true;
  }
  return false;
}

bool FSDPUnit::post_backward_in(
    const std::unordered_set<torch::autograd::Node*>* graph) const {
  return grad_node_ && (graph == nullptr || graph->count(grad_node_.get()));
}

void FSDPUnit::set_prefetch_list(bool forward,
                                 std::vector<std::weak_ptr<FSDPUnit>> units) {
  (forward ? forward_list_ : backward_list_) = std::move(units);
}

const std::vector<std::weak_ptr<FSDPUnit>>* FSDPUnit::prefetch_list(
    bool forward) const {
  const auto& list = forward ? forward_list_ : backward_list_;
  return list ? &*list : nullptr;
}

// ------------------------------------------------------------------- forward

std::shared_ptr<FSDPRootState> FSDPUnit::init_as_root() {
  auto alive = module_alive_.lock();
  if (alive) CheckPrefetchLists(*alive);
  if (!options_.reshard_after_forward.has_value() &&
      options_.reshard_after_forward_size == 0) {
    reshard_after_forward_ = false;  // its backward starts right away
  }
  UnitTreeOrder order = alive ? UnitsInTreeOrder(*alive) : UnitTreeOrder{};
  std::vector<FSDPUnit*> units = order.pre;
  root_state_ = std::make_shared<FSDPRootState>(
      std::move(order.pre), std::move(order.backward), options_.forward_prefetch,
      options_.backward_prefetch);
  root_ = root_state_;
  for (FSDPUnit* unit : units) {
    if (unit == this) continue;
    unit->root_state_.reset();  // it may have run alone before
    unit->root_ = root_state_;
  }
  return root_state_;
}

void FSDPUnit::pre_forward() {
  if (group_.deferred()) {
    throw FailedPreconditionError(
        "fsdp::forward: the parameters of '" + module_->name() + "' are still "
        "on the meta device (built under tensor_init_context()); call "
        "fsdp::materialize_module(root) or FSDP2Strategy::parallelize() first");
  }
  std::shared_ptr<FSDPRootState> root = root_.lock();
  if (!root) root = init_as_root();  // the first unit entered
  if (root_state_) root->begin_forward();
  root->enter_forward(this);
  ignored_.cast();
  if (at::GradMode::is_enabled() && !grad_params_.empty()) attach_grad_node();
}

at::Tensor FSDPUnit::cast_input(const at::Tensor& t) const {
  const auto& mp = options_.mp_policy;
  if (!mp.cast_forward_inputs || !mp.param_dtype.has_value() ||
      !t.defined() || !t.is_floating_point() ||
      t.scalar_type() == *mp.param_dtype) {
    return t;
  }
  return t.to(*mp.param_dtype);
}

void FSDPUnit::attach_grad_node() {
  if (grad_node_ && !grad_node_fired_) return;  // one node per backward
  grad_node_ = std::make_shared<PostBackwardNode>(weak_from_this());
  grad_node_fired_ = false;
  pre_backward_done_ = false;
  defer_backward_prefetch_ = false;
  for (size_t i : grad_params_) {
    const at::Tensor& compute = group_.params()[i].compute();
    const uint32_t input_nr = grad_node_->add_input_metadata(compute);
    torch::autograd::impl::set_gradient_edge(compute, Edge(grad_node_, input_nr));
  }
}

std::vector<at::Tensor> FSDPUnit::post_forward(
    std::vector<at::Tensor> outputs) {
  const bool grad = at::GradMode::is_enabled();
  reshard_after_pass(grad);
  if (!grad) ignored_.restore();  // else the backward needs the copies
  if (root_state_) root_state_->end_forward();
  const auto& dtype = options_.mp_policy.output_dtype;
  if (root_state_ && dtype.has_value()) {
    for (auto& t : outputs) {
      if (t.defined() && t.is_floating_point()) t = t.to(*dtype);
    }
  }
  if (!grad) return outputs;
  std::vector<size_t> which;
  variable_list hooked;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && outputs[i].requires_grad()) {
      which.push_back(i);
      hooked.push_back(outputs[i]);
    }
  }
  if (hooked.empty()) return outputs;
  hooked = PreBackwardFunction::apply(at::TensorList(hooked), weak_from_this());
  pre_backward_nodes_.erase(
      std::remove_if(pre_backward_nodes_.begin(), pre_backward_nodes_.end(),
                     [](const auto& weak) { return weak.expired(); }),
      pre_backward_nodes_.end());
  pre_backward_nodes_.push_back(hooked[0].grad_fn());
  for (size_t k = 0; k < which.size(); ++k) outputs[which[k]] = hooked[k];
  return outputs;
}

void FSDPUnit::abort_forward() {
  // Leave no half-done state behind: the next step starts from shards.
  group_.reshard();
  ignored_.restore();
}

// ------------------------------------------------------------------ backward

void FSDPUnit::pre_backward() {
  std::shared_ptr<FSDPRootState> root = root_.lock();
  if (root) root->queue_end_of_backward();
  if (pre_backward_done_) return;
  pre_backward_done_ = true;
  // All-gather again if resharded after forward, in canonical order.
  if (root) {
    root->enter_backward(this, /*defer_rest=*/defer_backward_prefetch_);
  } else {
    group_.wait_unshard();
  }
}

void FSDPUnit::post_recompute() {
  if (!defer_backward_prefetch_) return;
  defer_backward_prefetch_ = false;
  if (std::shared_ptr<FSDPRootState> root = root_.lock()) root->after_recompute();
}

void FSDPUnit::post_backward(const Node* node, std::vector<at::Tensor> grads) {
  if (node != grad_node_.get() || grad_node_fired_) return;  // stale graph
  grad_node_fired_ = true;
  std::shared_ptr<FSDPRootState> root = root_.lock();
  if (root) root->queue_end_of_backward();
  std::vector<at::Tensor> by_param(group_.params().size());
  for (size_t k = 0; k < grad_params_.size() && k < grads.size(); ++k) {
    by_param[grad_params_[k]] = std::move(grads[k]);
  }
  grads.clear();
  // The unsharded parameters are done with once their gradients exist:
  // free them before the reduction buffer is allocated, not after.
  group_.reshard();
  at::Tensor input = group_.prepare_reduction(std::move(by_param));
  if (!input.defined()) return;  // nothing to communicate
  if (!root) {
    // The root module died after this forward: no end of backward will
    // come, so finish the reduction here.
    group_.start_reduction(std::move(input));
    group_.finish_reduction();
    return;
  }
  root->reduction_ready(this, std::move(input));
}

void FSDPUnit::end_backward() {
  group_.finish_reduction();
  group_.flush_local_grads();
  group_.reshard();
  ignored_.restore();
  for (const FSDPParam& p : group_.params()) {
    torch::autograd::impl::set_gradient_edge(p.compute(), Edge());
  }
  grad_node_.reset();
  pre_backward_nodes_.clear();
  grad_node_fired_ = false;
  pre_backward_done_ = false;
  defer_backward_prefetch_ = false;
}

}  // namespace fsdp
}  // namespace fsdp2
