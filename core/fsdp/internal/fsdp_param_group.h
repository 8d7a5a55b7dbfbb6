// fsdp2/core/fsdp/internal/fsdp_param_group.h
//
// FSDPParamGroup: one unit's parameters, communicated together (PyTorch:
// _fsdp_param_group.py). It owns
//  - the process groups the unit shards over and replicates over, picked
//    from the options' mesh and strategy;
//  - the unsharded buffer: every parameter at full size in param_dtype, one
//    all-gather fills it. Its storage is allocated by unshard_async() and
//    freed by reshard() in place, so the views autograd saved stay valid;
//  - the gradient reduction: local accumulation while gradient sync is off,
//    the reduce-scatter / all-reduce in flight, and writing the shards'
//    .grad when it is finished.
//
// Unsharding is a small state machine, each step a no-op where it has
// nothing to do: sharded -> unshard_async() -> all-gather pending ->
// wait_unshard() -> unsharded -> reshard() -> sharded. With one rank and no
// dtype change there is no buffer: the parameters view the shards.
//
// Internal to core/fsdp. Not thread-safe: the training thread (and the
// autograd engine's callbacks on it) owns it; collectives run on the process
// groups' lanes.
#ifndef FSDP2_CORE_FSDP_INTERNAL_FSDP_PARAM_GROUP_H_
#define FSDP2_CORE_FSDP_INTERNAL_FSDP_PARAM_GROUP_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "core/comm/comm_handle.h"
#include "core/comm/process_group.h"
#include "core/fsdp/fsdp_options.h"
#include "core/fsdp/internal/fsdp_collectives.h"
#include "core/fsdp/internal/fsdp_param.h"
#include "core/fsdp/offload.h"
#include "core/fsdp/stats_types.h"

namespace c10 {
struct Event;
}  // namespace c10

namespace fsdp2 {
namespace fsdp {

class FSDPParamGroup {
 public:
  // Takes the unit's parameters (full size, registered in their modules)
  // and shards them: each module then holds this rank's shards. Throws
  // std::invalid_argument when the options do not fit the mesh, or the
  // parameters are on different devices or of different dtypes.
  FSDPParamGroup(std::vector<FSDPParam> params, const FSDPOptions& options);
  ~FSDPParamGroup();  // waits for an all-gather in flight
  FSDPParamGroup(const FSDPParamGroup&) = delete;
  FSDPParamGroup& operator=(const FSDPParamGroup&) = delete;

  // ---- unshard / reshard (see the file comment)
  void unshard_async();  // starts the all-gather (copy-in, then collective)
  void wait_unshard();   // finishes it; the parameters view the buffer
  void reshard();        // frees the buffer (after an all-gather in flight)
  // The reshard after a forward: with FSDPOptions::reshard_after_forward_size
  // strictly between 1 and the shard group size, keeps the rows this rank's
  // block group needs (post-forward state), so that the next unshard_async()
  // all-gathers within that group only; otherwise reshard().
  void reshard_after_forward();

  // Whether the unsharded buffer is valid (all-gathered and waited for):
  // false when sharded or with an all-gather in flight.
  bool unsharded() const { return state_ == State::kUnsharded; }
  // Whether unsharding communicates (an all-gather over the shard group).
  bool gathers() const { return shard_group_ != nullptr && !alias_shards_; }

  // ---- gradient reduction
  // Whether a backward now would communicate this unit's gradients: sync
  // on, some parameter requires grad, and another rank to reduce with.
  // The same on every rank (it depends on the options, the mesh and
  // set_requires_gradient_sync only), so every rank reduces the same units.
  bool reduces() const;
  // Takes one full-size gradient per parameter (undefined: none reached it,
  // also all of them when the unit did not run on this rank) and returns
  // the reduction input for start_reduction(), or an undefined tensor when
  // there is nothing to communicate: gradient sync is off (the gradients
  // are accumulated for the next synced backward), or there is one rank and
  // no replica (the gradients go straight to the shards' .grad, cast as a
  // reduction would). While reduces(), the input is defined even when no
  // gradient is: every rank issues every unit's reduction, and its
  // contribution flags (fsdp_collectives.h) tell the ranks which
  // parameters got a gradient anywhere.
  at::Tensor prepare_reduction(std::vector<at::Tensor> grads);
  // Issues the reduction of `input` on the gradient lane.
  void start_reduction(at::Tensor input);
  // Waits for the reduction in flight, if any, and adds it to the shards'
  // .grad of the parameters some rank contributed a gradient to; the others
  // keep their .grad as it was (undefined stays undefined, as in one process
  // where nothing reached them). Frozen parameters get none.
  void finish_reduction();

  // End of a synced backward on one rank with no replica: gradients
  // accumulated while sync was off go to the shards' .grad, also when this
  // backward did not reach the unit (with other ranks, the unit's
  // reduction carries them).
  void flush_local_grads();

  // CPU offload (OffloadPolicy): where the unit's reduced gradients go
  // (null: added to the shards' .grad before the reduction returns).
  void set_host_gradient_sink(HostGradientSink sink) { sink_ = std::move(sink); }
  // Whether the shards live in host memory (OffloadPolicy::cpu_offload).
  bool offloaded() const { return offload_; }

  void set_requires_gradient_sync(bool sync) { requires_grad_sync_ = sync; }
  // Off: reductions still reduce-scatter over the shard group (and free
  // the unsharded gradients), but leave the all-reduce over the replicas
  // for the next reduction with it on: this rank keeps the running sum of
  // its reduced rows (partial_grad_bytes()), and its shards' .grad are
  // written only then. Without replicas it changes nothing.
  void set_requires_all_reduce(bool all_reduce) { requires_all_reduce_ = all_reduce; }
  // Reduced gradients are divided by this; must be positive.
  void set_gradient_divide_factor(double factor);
  double gradient_divide_factor() const { return divide_factor_; }
  // Whether the shards are still meta tensors awaiting materialize_module()
  // (which clears it).
  bool deferred() const { return deferred_; }
  void set_deferred(bool deferred) { deferred_ = deferred; }
  // While deferred: the device the shards will be materialised on (their
  // compute tensors follow, and the unsharded buffer, which a deferred
  // group gets only here). materialize_module() calls it for every
  // deferred unit before it writes the shards. Throws FailedPrecondition
  // once materialised.
  void set_device(const at::Device& device);
  // The device the unit computes on.
  at::Device device() const { return compute_options_.device(); }

  const std::vector<FSDPParam>& params() const { return params_; }
  const std::shared_ptr<comm::ProcessGroup>& shard_group() const {
    return shard_group_;  // null: one shard
  }
  int shard_world() const { return shard_world_; }
  // Whether this rank is the first replica of its shards.
  bool primary_replica() const {
    return !replicate_group_ || replicate_group_->rank() == 0;
  }
  int64_t buffer_bytes() const;     // size of the unsharded buffer
  int64_t unsharded_bytes() const;  // buffer_bytes() while unsharded, else 0
  int64_t unsharded_grad_bytes() const;  // accumulated while sync is off
  // Reduced gradients held back while all-reduce is off.
  int64_t partial_grad_bytes() const {
    return partial_.defined() ? partial_.nbytes() : 0;
  }
  const CommWaitStats& comm_wait_stats() const { return wait_stats_; }
  void reset_comm_wait_stats() { wait_stats_ = CommWaitStats(); }

 private:
  // Whether another rank shares this unit's parameters (a shard group or
  // replicas): else its gradients are not communicated.
  bool has_peers() const { return shard_group_ != nullptr || replicate_group_ != nullptr; }
  // A rank's row of the reduction: the flat shard, then one contribution
  // flag per parameter (fsdp_collectives.h).
  int64_t reduction_width() const {
    return flat_numel_ + static_cast<int64_t>(params_.size());
  }
  // Copy-in for the all-gather into unsharded_; with offload, the shards
  // are first copied to the device on the copy stream, where the copy-in
  // follows them (staged_ marks its end) and, with a shard group, the
  // all-gather is issued from (it waits for that stream, not the compute
  // stream). Sets unshard_done_.
  void copy_in_and_all_gather();
  // With offload, the compute stream waits for the copies to the device.
  void wait_staged();
  // A reduced gradient for params_[i]'s shard, of its shape: added to its
  // .grad, or with offload kept for hand_over_host_grads().
  void deliver_grad(size_t i, const at::Tensor& grad);
  // With offload: copies the gradients deliver_grad() kept to the host
  // (the copy stream) and hands them to the sink as one HostGradients.
  void hand_over_host_grads();

  // kPostForward: sharded over the block group (post_forward_ holds this
  // rank's part), see reshard_after_forward().
  enum class State { kSharded, kPostForward, kUnshardPending, kUnsharded };
  int64_t post_forward_bytes() const {
    return post_forward_.defined() ? post_forward_.nbytes() : 0;
  }

  std::vector<FSDPParam> params_;
  std::shared_ptr<comm::ProcessGroup> shard_group_;      // null: world 1
  std::shared_ptr<comm::ProcessGroup> replicate_group_;  // null: world 1
  int shard_world_ = 1;
  int shard_rank_ = 0;
  int64_t data_parallel_size_ = 1;  // shard world * replicas
  at::ScalarType param_dtype_;
  at::ScalarType reduce_dtype_;
  at::TensorOptions compute_options_;  // param_dtype on the device
  int64_t flat_numel_ = 0;             // per-rank flat shard, padded
  bool has_padding_ = false;
  // World 1 with no dtype change: compute tensors alias the shards.
  bool alias_shards_ = false;
  bool requires_grad_sync_ = true;
  bool requires_all_reduce_ = true;
  double divide_factor_ = 1;
  bool deferred_ = false;
  bool offload_ = false;
  bool pin_memory_ = false;
  std::unique_ptr<c10::Event> staged_;  // offload: the copy-in's end (on a device)
  // Offload: the gradients of the reduction being finished, on the device,
  // by parameter index, until hand_over_host_grads().
  std::vector<std::pair<size_t, at::Tensor>> device_grads_;
  HostGradientSink sink_;

  State state_ = State::kSharded;
  // The block group backward all-gathers over after a partial reshard
  // (null: reshard fully), and this rank's part of the unsharded buffer in
  // that state: [shard_world_ / block size * flat_numel_], each parameter's
  // part at its flat offset times that ratio.
  std::shared_ptr<comm::ProcessGroup> post_forward_group_;
  at::Tensor post_forward_;
  // [world * (flat_numel_ + params)]: the parameters in the first world *
  // flat_numel_ elements; storage freed when sharded.
  at::Tensor unsharded_;
  comm::CommHandle unshard_done_;

  std::vector<at::Tensor> no_sync_grads_;  // unsharded, reduce dtype
  PendingReduction reduction_;
  // Which parameters had a gradient on this rank in the reduction being
  // prepared, then in the one in flight: theirs is certain to arrive, so
  // only the others need the ranks' contribution flags read (on a GPU, a
  // wait for the device).
  std::vector<bool> local_grads_, reduction_local_grads_;
  bool reduction_pending_ = false;
  // The reduction in flight skips the all-reduce: finish_reduction adds it
  // to partial_ instead of the shards' .grad.
  bool reduction_is_partial_ = false;
  // [reduction_width()], reduce dtype: this rank's sum of the reductions
  // that skipped the all-reduce since the last one that did (divided, the
  // contribution flags included); undefined when there are none.
  at::Tensor partial_;

  CommWaitStats wait_stats_;
};

// High-water mark of the unsharded buffers alive at once in this process
// since the last reset (bytes), and its reset to what is alive now.
int64_t PeakUnshardedBytes();
void ResetPeakUnshardedBytes();

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_FSDP_PARAM_GROUP_H_
