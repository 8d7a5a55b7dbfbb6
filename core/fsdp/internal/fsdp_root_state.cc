#include "core/fsdp/internal/fsdp_root_state.h"
#include "core/common/error.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include <torch/nn/module.h>

#include <algorithm>
#include <string>
#include <unordered_map>

#include "core/fsdp/internal/fsdp_param_group.h"
#include "core/fsdp/internal/fsdp_unit.h"
#include "core/fsdp/internal/unit_registry.h"

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

// The live units of `unit`'s explicit prefetch list into `out`; false
// (and `out` empty) where it has none.
bool ListOf(const FSDPUnit* unit, bool forward, std::vector<FSDPUnit*>& out) {
  out.clear();
  const std::vector<std::weak_ptr<FSDPUnit>>* list = unit->prefetch_list(forward);
  if (list == nullptr) return false;
  for (const auto& weak : *list) {
    if (auto target = weak.lock()) out.push_back(target.get());
  }
  return true;
}

}  // namespace

void CheckPrefetchLists(torch::nn::Module& root) {
  const UnitTreeOrder order = UnitsInTreeOrder(root);
  std::unordered_map<const torch::nn::Module*, std::string> names;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    names.emplace(item.value().get(), item.key());
  }
  auto name_of = [&](const FSDPUnit* unit) {
    auto it = names.find(unit->module());
    return it == names.end() ? UnitName(unit)
           : it->second.empty() ? std::string("the root module")
                                : "'" + it->second + "'";
  };
  std::vector<FSDPUnit*> entered;  // where the backward walk enters units
  for (const auto& [unit, enters] : order.backward) {
    if (enters) entered.push_back(unit);
  }
  for (const bool forward : {true, false}) {
    const std::vector<FSDPUnit*>& pass = forward ? order.pre : entered;
    const std::string what = forward ? "forward" : "backward";
    for (size_t at = 0; at < pass.size(); ++at) {
      const std::vector<std::weak_ptr<FSDPUnit>>* list = pass[at]->prefetch_list(forward);
      if (list == nullptr) continue;
      const std::string where = "fsdp: the " + what + " prefetch list of " + name_of(pass[at]);
      for (const auto& weak : *list) {
        std::shared_ptr<FSDPUnit> target = weak.lock();
        if (!target || !target->module_alive()) {
          throw InvalidArgumentError(where + " names a module that no longer exists");
        }
        const size_t i = IndexOf(pass, target.get());
        if (i == kNone) {
          throw InvalidArgumentError(
              where + " names " + UnitName(target.get()) +
              ", a unit of another root (not in this model's module tree); "
              "list only units of the same model");
        }
        if (i <= at) {
          throw InvalidArgumentError(
              where + " names " + name_of(target.get()) + ", which the " + what +
              " reaches before it (" +
              (forward ? "the module tree's pre-order" : "the reverse of it, children last first") +
              "); list only units that come after it");
        }
      }
    }
  }
}

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
  for (size_t i = next_forward_; i < at; ++i) {
    pre_order_[i]->skip_forward(grad);
    prefetch_forward(i);  // as the ranks that run it do
  }
  next_forward_ = at + 1;
  unit->param_group().wait_unshard();
  prefetch_forward(at);
}

void FSDPRootState::prefetch_forward(size_t at) {
  // Units already unsharded or in flight are left as they are.
  std::vector<FSDPUnit*> listed;
  if (ListOf(pre_order_[at], /*forward=*/true, listed)) {
    for (FSDPUnit* unit : listed) {
      const size_t i = IndexOf(pre_order_, unit);
      if (i != kNone && i > at) unit->param_group().unshard_async();
    }
    return;
  }
  for (size_t i = at + 1; i < pre_order_.size() && i <= at + forward_prefetch_; ++i) {
    pre_order_[i]->param_group().unshard_async();
  }
}

void FSDPRootState::end_forward() {
  if (!in_forward_) return;
  const bool grad = at::GradMode::is_enabled();
  for (size_t i = next_forward_; i < pre_order_.size(); ++i) {
    pre_order_[i]->skip_forward(grad);
    prefetch_forward(i);  // as the ranks that run it do
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
      } else if (unit->prefetch_list(/*forward=*/false) != nullptr) {
        Op marker{true, unit, unit->pre_backward_in(graph)};
        marker.marker = true;  // where its list's all-gathers go
        ops_.push_back(std::move(marker));
      }
    } else if (group.reduces()) {
      ops_.push_back({false, unit, unit->post_backward_in(graph)});
    }
  }
  // The prefetch by depth: each all-gather goes ahead of the
  // backward_prefetch_ reductions before it, never past another all-gather,
  // unless the all-gather before it is of a unit with an explicit list.
  const FSDPUnit* previous = nullptr;  // the unit of the last all-gather
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (!ops_[i].gather) continue;
    const FSDPUnit* before = previous;
    previous = ops_[i].unit;
    if (ops_[i].marker ||
        (before != nullptr && before->prefetch_list(/*forward=*/false) != nullptr)) {
      continue;
    }
    for (size_t j = i, passed = 0;
         j > 0 && !ops_[j - 1].gather && passed < backward_prefetch_; --j, ++passed) {
      std::swap(ops_[j - 1], ops_[j]);
    }
  }
  // Explicit lists: the all-gathers listed go right behind the unit's own,
  // in the list's order (those already ahead of it stay where they are).
  std::vector<FSDPUnit*> listed;
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (!ops_[i].gather || !ListOf(ops_[i].unit, /*forward=*/false, listed)) continue;
    size_t insert = i + 1;
    for (FSDPUnit* target : listed) {
      for (size_t j = insert; j < ops_.size(); ++j) {
        if (!ops_[j].gather || ops_[j].unit != target) continue;
        Op op = std::move(ops_[j]);
        op.listed = true;
        ops_.erase(ops_.begin() + static_cast<std::ptrdiff_t>(j));
        ops_.insert(ops_.begin() + static_cast<std::ptrdiff_t>(insert++), std::move(op));
        break;
      }
    }
  }
}

void FSDPRootState::issue(Op& op, bool force) {
  FSDPParamGroup& group = op.unit->param_group();
  if (op.marker) {
    op.issued = true;
    return;
  }
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
          (op.marker || !prefetch || (!op.listed && kept_.size() >= backward_prefetch_))) {
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
