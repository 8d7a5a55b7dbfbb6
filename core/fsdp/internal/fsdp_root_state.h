// fsdp2/core/fsdp/internal/fsdp_root_state.h
//
// FSDPRootState: what only the root unit (the first unit a forward enters)
// keeps for the whole module tree under it (PyTorch: the root's part of
// _fsdp_state.py and its FSDPStateContext): the order of the units'
// collectives, prefetching, the gradient reductions in flight and the end
// of backward.
//
// Units that run on only some ranks. A unit may be skipped on one rank and
// called on another in the same step (an expert that gets no rows, an early
// exit, a data-dependent branch). Every rank must still issue the same
// collectives in the same order on each lane, and the result must equal one
// process training the global batch. So the collectives do not follow the
// order this rank happened to call the units in, but canonical orders that
// every rank derives from the module tree without communicating
// (UnitsInTreeOrder): the order a normal model calls its units in.
//  - Forward all-gathers follow the tree's pre-order with a cursor. When a
//    unit is entered, every unit between the cursor and it is "skipped":
//    it all-gathers as if it had run (so the ranks that do run it find a
//    matching all-gather) and is resharded as its own post-forward would
//    have done, so that the units' unshard states, and with them the
//    collectives that follow, stay the same on every rank. The root's
//    post-forward skips what is left. Prefetch: the unit after the cursor.
//    A unit entered again after the cursor passed it (called twice, or out
//    of tree order) all-gathers where it is called, as before: every rank
//    must then call it at the same place.
//  - Backward all-gathers: the units sharded when the backward begins, in
//    reverse post-order (the order their pre-backwards fire in a normal
//    backward: a unit before the units inside it), with a cursor. When a
//    unit's pre-backward fires, the units before it in that order are
//    all-gathered now: kept if this backward will still run them here
//    (their pre-backward node is in the autograd graph), else freed at
//    once. The end of backward all-gathers and frees the rest.
//  - Gradient reductions: every unit that reduces (FSDPParamGroup::reduces,
//    the same on every rank) reduces in every synced backward, in reverse
//    pre-order (the order a normal backward finishes units in). A unit's
//    reduction starts when its gradients are ready and every unit before it
//    has started; until then its reduction input waits here. A unit whose
//    post-backward node is not in this backward's autograd graph (it did
//    not run here, or its output does not reach the loss) reduces zeros in
//    its turn without waiting. Contribution flags in the reduction
//    (fsdp_collectives.h) tell every rank which parameters got a gradient
//    anywhere: those that none did keep their .grad as it was.
// In a model whose ranks all call every unit in tree order nothing is
// skipped and no collective is added: the orders are the ones the units run
// in.
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

#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <vector>

namespace fsdp2 {
namespace fsdp {

class FSDPParamGroup;
class FSDPUnit;

class FSDPRootState : public std::enable_shared_from_this<FSDPRootState> {
 public:
  // `pre_order`, `post_order`: every unit in the root's module tree in the
  // tree's pre-order (the root first) and post-order (UnitsInTreeOrder).
  FSDPRootState(std::vector<FSDPUnit*> pre_order,
                std::vector<FSDPUnit*> post_order);

  // ---- forward
  // The root's pre-forward: a pass starts, the cursor at the start.
  void begin_forward();
  // `unit`'s pre-forward: skips the units between the cursor and it,
  // unshards it and prefetches the next unit (see the file comment).
  void enter_forward(FSDPUnit* unit);
  // The root's post-forward: skips the units the cursor has not reached.
  void end_forward();

  // ---- backward
  // Called by every hook of a backward before it acts. The first call of a
  // backward begins it (the orders of its collectives and what this rank
  // will run, from the autograd graph) and queues end_backward() on the
  // autograd engine.
  void queue_end_of_backward();
  // `unit`'s pre-backward: unshards the units up to it in backward order
  // and it, and prefetches the next (see the file comment).
  void enter_backward(FSDPUnit* unit);
  // `unit`'s post-backward prepared `input` (FSDPParamGroup::
  // prepare_reduction): starts it, and every reduction after it that can
  // start, in order.
  void reduction_ready(FSDPUnit* unit, at::Tensor input);
  // End of backward: starts the reductions left (zeros where this rank has
  // no gradients), all-gathers and frees the units left in backward order,
  // finishes every reduction, reshards every unit and clears their backward
  // state, including units whose backward never ran.
  void end_backward();

 private:
  // One: a reduction runs while the next unit computes its gradients, and
  // each further one would hold another unit-sized buffer (measured without
  // a cap: ~240 MiB extra per rank on a 40M-parameter GPT).
  static constexpr size_t kMaxReductionsInFlight = 1;

  struct BackwardGather {
    FSDPUnit* unit;
    bool runs_here;  // its pre-backward node is in this backward's graph
  };
  struct Reduction {
    FSDPUnit* unit;
    bool fires_here;  // its post-backward node is in this backward's graph
    at::Tensor input;  // prepared, waiting for its turn
  };

  void begin_backward();
  // Starts the reductions in order from the cursor while each one's input
  // is ready, or (`force`, or its unit will not fire here) can be made of
  // zeros and whatever gradients this rank accumulated without sync.
  void start_ready_reductions(bool force);
  // While at the cap, the oldest reduction is finished: its group waits for
  // it, writes its shards' .grad and drops its buffers.
  void make_room_for_reduction();

  std::vector<FSDPUnit*> pre_order_;   // forward order; the root first
  std::vector<FSDPUnit*> post_order_;  // reversed: backward gather order

  bool in_forward_ = false;
  size_t next_forward_ = 0;  // the first unit of pre_order_ not yet passed

  bool end_of_backward_queued_ = false;
  std::vector<BackwardGather> backward_gathers_;
  size_t next_backward_gather_ = 0;
  std::vector<Reduction> reductions_;  // reverse pre-order
  size_t next_reduction_ = 0;
  std::deque<FSDPParamGroup*> reductions_in_flight_;  // oldest first
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_FSDP_ROOT_STATE_H_
