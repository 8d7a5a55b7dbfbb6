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

FSDPRootState::FSDPRootState(
    std::vector<FSDPUnit*> pre_order,
    std::vector<std::pair<FSDPUnit*, bool>> backward_walk, int forward_prefetch,
    int backward_prefetch)
    : pre_order_(std::move(pre_order)),
      backward_walk_(std::move(backward_walk)),
      forward_prefetch_(static_cast<size_t>(std::max(forward_prefetch, 0))),
      backward_prefetch_(static_cast<size_t>(std::max(backward_prefetch, 0))) {}

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
  // The prefetch; units already unsharded or in flight are left as they are.
  for (size_t i = next_forward_;
       i < pre_order_.size() && i < next_forward_ + forward_prefetch_; ++i) {
    pre_order_[i]->param_group().unshard_async();
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
  ops_.clear();
  next_op_ = 0;
  kept_.clear();
  for (const auto& [unit, entered] : backward_walk_) {
    const FSDPParamGroup& group = unit->param_group();
    if (entered) {
      if (group.gathers() && !group.unsharded()) {
        ops_.push_back({true, unit, unit->pre_backward_in(graph)});
      }
    } else if (group.reduces()) {
      ops_.push_back({false, unit, unit->post_backward_in(graph)});
    }
  }
  // The prefetch: each all-gather goes ahead of the backward_prefetch_
  // reductions before it, never past another all-gather.
  for (size_t i = 1; i < ops_.size(); ++i) {
    if (!ops_[i].gather) continue;
    for (size_t j = i, passed = 0;
         j > 0 && !ops_[j - 1].gather && passed < backward_prefetch_; --j, ++passed) {
      std::swap(ops_[j - 1], ops_[j]);
    }
  }
}

void FSDPRootState::issue(Op& op, bool force) {
  FSDPParamGroup& group = op.unit->param_group();
  if (op.gather) {
    if (op.here && !force) {
      group.unshard_async();  // kept for the unit's pre-backward
      kept_.push_back(op.unit);
    } else {
      group.wait_unshard();  // this rank's part in the others' all-gather
      group.reshard();
    }
  } else {
    if (!op.input.defined()) op.input = group.prepare_reduction({});
    start_reduction(group, std::move(op.input));
    op.input = at::Tensor();
  }
  op.issued = true;
}

void FSDPRootState::issue_in_order(size_t limit, bool force, bool prefetch) {
  for (; next_op_ < ops_.size() && (limit == kAll || next_op_ <= limit);
       ++next_op_) {
    Op& op = ops_[next_op_];
    if (op.issued) continue;
    if (!force && op.here) {
      if (!op.gather && !op.input.defined()) return;  // gradients coming
      if (op.gather && limit == kAll &&
          (!prefetch || kept_.size() >= backward_prefetch_)) {
        return;
      }
    }
    issue(op, force);
  }
}

void FSDPRootState::enter_backward(FSDPUnit* unit, bool defer_rest) {
  size_t at = kNone;
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i].gather && ops_[i].unit == unit) at = i;
  }
  if (at != kNone) {
    const bool issued_before = ops_[at].issued;
    if (!issued_before) {
      issue_in_order(at, /*force=*/false);
      // A reduction before it still waits for gradients this rank computes
      // later: the all-gathers go ahead of it, in their order.
      for (size_t i = next_op_; i <= at && !ops_[at].issued; ++i) {
        if (ops_[i].gather && !ops_[i].issued) issue(ops_[i], /*force=*/false);
      }
    }
    auto kept = std::find(kept_.begin(), kept_.end(), unit);
    const bool was_kept = kept != kept_.end();
    if (was_kept) kept_.erase(kept);
    if (issued_before && !was_kept && !unit->param_group().unsharded()) {
      // Gathered in its turn and freed because the autograd graph did not
      // contain its pre-backward: all-gathering here alone would
      // desynchronise the ranks.
      throw InternalError("fsdp: the backward of " + UnitName(unit) +
                          " ran after its all-gather turn had been given up");
    }
  }
  unit->param_group().wait_unshard();
  if (defer_rest) {
    // The recomputation comes next: finish the reductions in flight, so
    // that no reduction buffer is held beside the recomputed activations
    // and the last one is idle for them to borrow (RecomputeArena).
    finish_reductions_beyond(0);
    return;
  }
  issue_in_order(kAll, /*force=*/false);  // prefetch, reductions that can go
}

void FSDPRootState::after_recompute() {
  issue_in_order(kAll, /*force=*/false, /*prefetch=*/false);
}

void FSDPRootState::reduction_ready(FSDPUnit* unit, at::Tensor input) {
  for (Op& op : ops_) {
    if (op.gather || op.unit != unit) continue;
    if (op.issued) {
      throw InternalError("fsdp: the gradients of " + UnitName(unit) +
                          " arrived after its reduction had been issued "
                          "without them");
    }
    op.input = std::move(input);
    issue_in_order(kAll, /*force=*/false);
    return;
  }
  // Not in this root's tree (called on its own): reduce now.
  start_reduction(unit->param_group(), std::move(input));
}

void FSDPRootState::start_reduction(FSDPParamGroup& group, at::Tensor input) {
  finish_reductions_beyond(kMaxReductionsInFlight - 1);
  group.start_reduction(std::move(input));
  reductions_in_flight_.push_back(&group);
}

void FSDPRootState::finish_reductions_beyond(size_t keep) {
  while (reductions_in_flight_.size() > keep) {
    FSDPParamGroup* oldest = reductions_in_flight_.front();
    reductions_in_flight_.pop_front();
    oldest->finish_reduction();
  }
}

void FSDPRootState::end_backward() {
  end_of_backward_queued_ = false;
  issue_in_order(kAll, /*force=*/true);
  ops_.clear();
  next_op_ = 0;
  kept_.clear();
  reductions_in_flight_.clear();
  for (FSDPUnit* unit : pre_order_) unit->end_backward();
}

}  // namespace fsdp
}  // namespace fsdp2
