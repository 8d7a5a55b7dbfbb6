// fsdp2/core/fsdp/internal/fsdp_root_state.h
//
// FSDPRootState: what only the root unit (the first unit a forward enters)
// keeps for the whole module tree under it (PyTorch: the root's part of
// _fsdp_state.py and its FSDPStateContext):
//  - every unit in the tree, for the end of backward;
//  - the order units ran their forward in, which drives prefetching: the
//    next unit's all-gather starts while this one computes;
//  - the gradient reductions in flight, at most kMaxReductionsInFlight;
//  - the end-of-backward callback, queued once per backward.
//
// Ownership: the root unit owns it (shared_ptr); every other unit of the tree
// holds a weak_ptr. It holds the units as plain pointers: they are the units
// of the root module's tree, alive while the root module is.
//
// Internal to core/fsdp. Not thread-safe: used from the training thread and
// the autograd engine's callbacks on it.
#ifndef FSDP2_CORE_FSDP_INTERNAL_FSDP_ROOT_STATE_H_
#define FSDP2_CORE_FSDP_INTERNAL_FSDP_ROOT_STATE_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <deque>
#include <memory>
#include <vector>

namespace fsdp2 {
namespace fsdp {

class FSDPParamGroup;
class FSDPUnit;

class FSDPRootState : public std::enable_shared_from_this<FSDPRootState> {
 public:
  // `units`: every unit in the root's module tree, the root first.
  explicit FSDPRootState(std::vector<FSDPUnit*> units);

  // ---- forward
  // The root's pre-forward: the pass that ended becomes the order to
  // prefetch in, and recording starts afresh.
  void begin_forward();
  // Records that `unit` entered (left) its forward in this pass.
  void record_pre_forward(FSDPUnit* unit);
  void record_post_forward(FSDPUnit* unit);
  // The unit whose all-gather to prefetch once `unit` has unsharded, or null.
  // Forward follows the previous pass's pre-forward order. Backward runs in
  // reverse post-forward order, in which the root (whose forward ends last)
  // comes first and is followed by the last block: walking the pre-forward
  // order instead would prefetch nothing from the root.
  FSDPUnit* next_in_forward(const FSDPUnit* unit) const;
  FSDPUnit* next_in_backward(const FSDPUnit* unit) const;

  // ---- backward
  // Queues end_backward() on the autograd engine, once per backward.
  void queue_end_of_backward();
  // Bounds the reductions in flight: each holds a unit-sized input buffer,
  // and a backward that outruns the gradient lane would otherwise keep one
  // per unit alive (measured: ~240 MiB extra per rank on a 40M-parameter
  // GPT). While at the cap, the oldest reduction is finished: its group
  // waits for it, writes its shards' .grad and drops its buffers.
  void make_room_for_reduction();
  // Records a reduction `group` has just started.
  void track_reduction(FSDPParamGroup* group);
  // End of backward: finishes every reduction, reshards every unit and
  // clears their backward state, including units whose backward never ran.
  void end_backward();

 private:
  // One: a reduction runs while the next unit computes its gradients, and
  // each further one would hold another unit-sized buffer.
  static constexpr size_t kMaxReductionsInFlight = 1;

  std::vector<FSDPUnit*> units_;
  std::vector<FSDPUnit*> forward_order_;       // this pass
  std::vector<FSDPUnit*> last_forward_order_;  // the previous pass
  std::vector<FSDPUnit*> post_forward_order_;  // this pass
  bool end_of_backward_queued_ = false;
  std::deque<FSDPParamGroup*> reductions_in_flight_;  // oldest first
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_FSDP_ROOT_STATE_H_
