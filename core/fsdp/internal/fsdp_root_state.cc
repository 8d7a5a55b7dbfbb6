#include "core/fsdp/internal/fsdp_root_state.h"
#include "core/common/error.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <string>

#include "core/fsdp/internal/fsdp_param_group.h"
#include "core/fsdp/internal/fsdp_unit.h"

namespace fsdp2 {
namespace fsdp {
namespace {

constexpr size_t kNone = static_cast<size_t>(-1);

size_t IndexOf(const std::vector<FSDPUnit*>& order, const FSDPUnit* unit) {
  auto it = std::find(order.begin(), order.end(), unit);
  return it == order.end() ? kNone : static_cast<size_t>(it - order.begin());
}

std::string UnitName(const FSDPUnit* unit) {
  return unit->module_alive() ? "'" + unit->module()->name() + "'" : "a unit";
}

}  // namespace

FSDPRootState::FSDPRootState(std::vector<FSDPUnit*> pre_order,
                             std::vector<FSDPUnit*> post_order)
    : pre_order_(std::move(pre_order)), post_order_(std::move(post_order)) {
  std::reverse(post_order_.begin(), post_order_.end());
}

// ------------------------------------------------------------------- forward

void FSDPRootState::begin_forward() {
  in_forward_ = true;
  next_forward_ = 0;
}

void FSDPRootState::enter_forward(FSDPUnit* unit) {
  const size_t at = IndexOf(pre_order_, unit);
  if (!in_forward_ || at == kNone || at < next_forward_) {
    // Outside a pass of the root, or entered again: where it is called.
    unit->param_group().wait_unshard();
    return;
  }
  const bool grad = at::GradMode::is_enabled();
  for (size_t i = next_forward_; i < at; ++i) pre_order_[i]->skip_forward(grad);
  next_forward_ = at + 1;
  unit->param_group().wait_unshard();
  if (next_forward_ < pre_order_.size()) {
    pre_order_[next_forward_]->param_group().unshard_async();  // prefetch
  }
}

void FSDPRootState::end_forward() {
  if (!in_forward_) return;
  const bool grad = at::GradMode::is_enabled();
  for (size_t i = next_forward_; i < pre_order_.size(); ++i) {
    pre_order_[i]->skip_forward(grad);
  }
  next_forward_ = pre_order_.size();
  in_forward_ = false;
}

// ------------------------------------------------------------------ backward

void FSDPRootState::queue_end_of_backward() {
  if (end_of_backward_queued_) return;
  end_of_backward_queued_ = true;
  begin_backward();
  std::weak_ptr<FSDPRootState> self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto root = self.lock()) root->end_backward();
  });
}

void FSDPRootState::begin_backward() {
  // The nodes this backward will run: every node reachable from its roots
  // (backward() runs them all; fully_shard.h rules out autograd::grad).
  const std::unordered_set<torch::autograd::Node*>* graph =
      torch::autograd::get_current_graph_task_nodes_in_graph();
  backward_gathers_.clear();
  next_backward_gather_ = 0;
  for (FSDPUnit* unit : post_order_) {
    const FSDPParamGroup& group = unit->param_group();
    // Unshard states are the same on every rank here (see the file
    // comment), so every rank lists the same units.
    if (group.gathers() && !group.unsharded()) {
      backward_gathers_.push_back({unit, unit->pre_backward_in(graph)});
    }
  }
  reductions_.clear();
  next_reduction_ = 0;
  for (auto it = pre_order_.rbegin(); it != pre_order_.rend(); ++it) {
    if ((*it)->param_group().reduces()) {
      reductions_.push_back({*it, (*it)->post_backward_in(graph), at::Tensor()});
    }
  }
}

void FSDPRootState::enter_backward(FSDPUnit* unit) {
  size_t at = kNone;
  for (size_t i = 0; i < backward_gathers_.size(); ++i) {
    if (backward_gathers_[i].unit == unit) at = i;
  }
  if (at != kNone && at >= next_backward_gather_) {
    for (size_t i = next_backward_gather_; i < at; ++i) {
      FSDPParamGroup& group = backward_gathers_[i].unit->param_group();
      group.wait_unshard();
      // Kept for its own pre-backward later in this backward, or done.
      if (!backward_gathers_[i].runs_here) group.reshard();
    }
    next_backward_gather_ = at + 1;
  } else if (at != kNone && !unit->param_group().unsharded()) {
    // Gathered in its turn and freed because the autograd graph did not
    // contain its pre-backward: all-gathering here alone would desynchronise
    // the ranks.
    throw InternalError("fsdp: the backward of " + UnitName(unit) +
                        " ran after its all-gather turn had been given up");
  }
  unit->param_group().wait_unshard();
  if (next_backward_gather_ < backward_gathers_.size()) {
    backward_gathers_[next_backward_gather_].unit->param_group().unshard_async();
  }
}

void FSDPRootState::reduction_ready(FSDPUnit* unit, at::Tensor input) {
  for (size_t i = next_reduction_; i < reductions_.size(); ++i) {
    if (reductions_[i].unit == unit) {
      reductions_[i].input = std::move(input);
      start_ready_reductions(/*force=*/false);
      return;
    }
  }
  for (size_t i = 0; i < next_reduction_; ++i) {
    if (reductions_[i].unit == unit) {
      throw InternalError("fsdp: the gradients of " + UnitName(unit) +
                          " arrived after its reduction had been issued "
                          "without them");
    }
  }
  // Not in this root's tree (called on its own): reduce now.
  make_room_for_reduction();
  unit->param_group().start_reduction(std::move(input));
  reductions_in_flight_.push_back(&unit->param_group());
}

void FSDPRootState::start_ready_reductions(bool force) {
  while (next_reduction_ < reductions_.size()) {
    Reduction& r = reductions_[next_reduction_];
    FSDPParamGroup& group = r.unit->param_group();
    if (!r.input.defined()) {
      if (r.fires_here && !force) return;  // its gradients are coming
      r.input = group.prepare_reduction({});  // no gradients from this rank
    }
    make_room_for_reduction();
    group.start_reduction(std::move(r.input));
    r.input = at::Tensor();
    reductions_in_flight_.push_back(&group);
    ++next_reduction_;
  }
}

void FSDPRootState::make_room_for_reduction() {
  while (reductions_in_flight_.size() >= kMaxReductionsInFlight) {
    FSDPParamGroup* oldest = reductions_in_flight_.front();
    reductions_in_flight_.pop_front();
    oldest->finish_reduction();
  }
}

void FSDPRootState::end_backward() {
  end_of_backward_queued_ = false;
  start_ready_reductions(/*force=*/true);
  for (size_t i = next_backward_gather_; i < backward_gathers_.size(); ++i) {
    FSDPParamGroup& group = backward_gathers_[i].unit->param_group();
    group.wait_unshard();
    group.reshard();
  }
  backward_gathers_.clear();
  next_backward_gather_ = 0;
  reductions_.clear();
  next_reduction_ = 0;
  reductions_in_flight_.clear();
  for (FSDPUnit* unit : pre_order_) unit->end_backward();
}

}  // namespace fsdp
}  // namespace fsdp2
