#include "core/fsdp/internal/fsdp_root_state.h"

#include <torch/csrc/autograd/engine.h>

#include <algorithm>

#include "core/fsdp/internal/fsdp_param_group.h"
#include "core/fsdp/internal/fsdp_unit.h"

namespace fsdp2 {
namespace fsdp {
namespace {

void AppendOnce(std::vector<FSDPUnit*>& order, FSDPUnit* unit) {
  if (std::find(order.begin(), order.end(), unit) == order.end()) {
    order.push_back(unit);
  }
}

// The unit `step` places after `unit` in `order`, or null.
FSDPUnit* Neighbour(const std::vector<FSDPUnit*>& order, const FSDPUnit* unit,
                    int step) {
  auto it = std::find(order.begin(), order.end(), unit);
  if (it == order.end()) return nullptr;
  const auto index = (it - order.begin()) + step;
  if (index < 0 || index >= static_cast<int64_t>(order.size())) return nullptr;
  return order[index];
}

}  // namespace

FSDPRootState::FSDPRootState(std::vector<FSDPUnit*> units)
    : units_(std::move(units)) {}

void FSDPRootState::begin_forward() {
  if (!forward_order_.empty()) last_forward_order_ = forward_order_;
  forward_order_.clear();
  post_forward_order_.clear();
}

void FSDPRootState::record_pre_forward(FSDPUnit* unit) {
  AppendOnce(forward_order_, unit);
}

void FSDPRootState::record_post_forward(FSDPUnit* unit) {
  AppendOnce(post_forward_order_, unit);
}

FSDPUnit* FSDPRootState::next_in_forward(const FSDPUnit* unit) const {
  return Neighbour(last_forward_order_, unit, +1);
}

FSDPUnit* FSDPRootState::next_in_backward(const FSDPUnit* unit) const {
  return Neighbour(post_forward_order_, unit, -1);
}

void FSDPRootState::queue_end_of_backward() {
  if (end_of_backward_queued_) return;
  end_of_backward_queued_ = true;
  std::weak_ptr<FSDPRootState> self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto root = self.lock()) root->end_backward();
  });
}

void FSDPRootState::make_room_for_reduction() {
  while (reductions_in_flight_.size() >= kMaxReductionsInFlight) {
    FSDPParamGroup* oldest = reductions_in_flight_.front();
    reductions_in_flight_.pop_front();
    oldest->finish_reduction();
  }
}

void FSDPRootState::track_reduction(FSDPParamGroup* group) {
  reductions_in_flight_.push_back(group);
}

void FSDPRootState::end_backward() {
  end_of_backward_queued_ = false;
  reductions_in_flight_.clear();
  for (FSDPUnit* unit : units_) unit->end_backward();
}

}  // namespace fsdp
}  // namespace fsdp2
