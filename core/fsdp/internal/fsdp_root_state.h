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
//    post-forward skips what is left. Prefetch: each unit, entered or
//    skipped, then all-gathers the forward_prefetch units after it, or the
//    units of its explicit list (FSDPUnit::prefetch_list), which come
//    after it in this order (CheckPrefetchLists).
//    A unit entered again after the cursor passed it (called twice, or out
//    of tree order) all-gathers where it is called, as before: every rank
//    must then call it at the same place.
//  - Backward: one sequence of operations for the whole backward, the
//    same on every rank, made from a depth-first walk of the tree with the
//    children in reverse (the order a normal backward runs units in): the
//    all-gather of a unit when the walk enters it (if it is sharded when
//    the backward begins: unshard states agree across ranks), its
//    reduction when the walk leaves it (if it reduces: FSDPParamGroup::
//    reduces, the same on every rank); each all-gather is moved ahead of
//    the backward_prefetch reductions just before it (not past another
//    all-gather), which is the prefetch (with depth 1, the next unit's
//    all-gather overlaps this one's gradients). A unit with an explicit
//    list instead moves the all-gathers of its list right behind its own
//    (past anything), and the all-gather after its own stays in place;
//    one that is already unsharded gets a marker there for its list.
//    Every rank issues these operations in this order, over both lanes,
//    and waits only for operations it has issued: then no rank can wait
//    for one that another rank will issue only after a wait of its own
//    (the ranks would deadlock if one issued a reduction before an
//    all-gather that another issued after it).
//    What a rank does at an operation depends on what this backward runs
//    here, which the autograd graph tells at its start: an all-gather of a
//    unit whose pre-backward will run here is issued and kept for it (at
//    most one ahead of its pre-backward: the prefetch), that of a unit that
//    will not is waited for and freed at once; a reduction waits for the
//    unit's gradients if its post-backward will run here, else reduces
//    zeros at once. Should a pre-backward run while an earlier reduction
//    still waits for gradients this rank computes later (a unit order the
//    walk does not foresee), the all-gathers up to it go ahead of that
//    reduction, each lane still in order.
//    Contribution flags in the reduction (fsdp_collectives.h) tell every
//    rank which parameters got a gradient anywhere: those that none did
//    keep their .grad as it was.
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
#include <utility>
#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace fsdp2 {
namespace fsdp {

class FSDPParamGroup;
class FSDPUnit;

// Throws InvalidArgumentError, naming the unit and the module, where an
// explicit prefetch list of a unit under `root` names a module that is
// gone, not under `root` (a unit of another root), or one that the pass
// reaches no later than the unit itself (forward: the pre-order; backward:
// where the backward walk enters units).
void CheckPrefetchLists(torch::nn::Module& root);

class FSDPRootState : public std::enable_shared_from_this<FSDPRootState> {
 public:
  // `pre_order`, `backward_walk`: the units of the root's module tree in
  // pre-order (the root first) and the backward walk (UnitsInTreeOrder).
  // `forward_prefetch`, `backward_prefetch`: how many units ahead to
  // all-gather (FSDPOptions; the same on every rank, so the orders stay
  // the same too).
  FSDPRootState(std::vector<FSDPUnit*> pre_order,
                std::vector<std::pair<FSDPUnit*, bool>> backward_walk,
                int forward_prefetch = 1, int backward_prefetch = 1);

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
  // `unit`'s pre-backward: issues the operations up to its all-gather and
  // unshards it (see the file comment), then what can follow, unless
  // `defer_rest` (a checkpointed unit: it finishes the reductions in flight
  // instead, so that the last one's buffer is idle for the recomputation
  // to borrow (RecomputeArena), and after_recompute() issues the rest).
  void enter_backward(FSDPUnit* unit, bool defer_rest = false);
  // A checkpointed unit's recomputation is done: issues the reductions
  // enter_backward left (none is in flight: it finished them).
  // The next unit's all-gather (the prefetch) waits for this unit's
  // reduction_ready(), which issues it ahead of that reduction, as the
  // sequence orders them: gathered during this unit's backward, it would be
  // a second unit-sized buffer beside the recomputed activations and their
  // gradients. Its wait is then exposed, once per checkpointed unit.
  void after_recompute();
  // `unit`'s post-backward prepared `input` (FSDPParamGroup::
  // prepare_reduction): it is started in its turn, with what can follow.
  void reduction_ready(FSDPUnit* unit, at::Tensor input);
  // End of backward: issues the operations left (reductions of zeros where
  // this rank has no gradients, all-gathers freed at once), finishes every
  // reduction, reshards every unit and clears their backward state,
  // including units whose backward never ran.
  void end_backward();

 private:
  // One: a reduction runs while the next unit computes its gradients, and
  // each further one would hold another unit-sized buffer (measured without
  // a cap: ~240 MiB extra per rank on a 40M-parameter GPT).
  static constexpr size_t kMaxReductionsInFlight = 1;

  // One operation of the backward sequence (see the file comment).
  struct Op {
    bool gather;       // an all-gather, else a reduction
    FSDPUnit* unit;
    bool here;         // its pre-backward (gather) / post-backward (reduce)
                       // node is in this backward's autograd graph
    bool issued = false;
    bool listed = false;  // moved by an explicit list: not held to the depth
    // No all-gather: the unit is already unsharded, and has an explicit
    // list, which follows it; issued at the unit's pre-backward.
    bool marker = false;
    at::Tensor input;  // a reduction's input, waiting for its turn
  };

  // The forward_prefetch units after pre_order_[at], or its explicit list.
  void prefetch_forward(size_t at);

  void begin_backward();
  // Issues the operations in order from the first one not issued: through
  // `limit` (an index; kAll: as far as it can go), or until a reduction
  // whose gradients are still coming here (unless `force`), or an
  // all-gather beyond backward_prefetch_ kept for units whose pre-backward
  // has not run yet (without `prefetch`: the first one).
  void issue_in_order(size_t limit, bool force, bool prefetch = true);
  void issue(Op& op, bool force);  // one operation (see the file comment)
  // Starts `group`'s reduction of `input`, first finishing the oldest one
  // in flight while at the cap.
  void start_reduction(FSDPParamGroup& group, at::Tensor input);
  // Finishes the oldest reductions in flight until at most `keep` remain:
  // each group waits for its reduction, writes its shards' .grad and drops
  // its buffers.
  void finish_reductions_beyond(size_t keep);

  static constexpr size_t kAll = static_cast<size_t>(-1);

  std::vector<FSDPUnit*> pre_order_;  // forward order; the root first
  std::vector<std::pair<FSDPUnit*, bool>> backward_walk_;
  size_t forward_prefetch_ = 1;
  size_t backward_prefetch_ = 1;

  bool in_forward_ = false;
  size_t next_forward_ = 0;  // the first unit of pre_order_ not yet passed

  bool end_of_backward_queued_ = false;
  std::vector<Op> ops_;     // this backward's sequence
  size_t next_op_ = 0;      // every operation before it is issued
  // All-gathers issued ahead of their unit's pre-backward, not yet used.
  std::vector<FSDPUnit*> kept_;
  std::deque<FSDPParamGroup*> reductions_in_flight_;  // oldest first
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_FSDP_ROOT_STATE_H_
