// fsdp2/core/fsdp/fsdp_unit.h
//
// FSDPUnit: the state fully_shard() attaches to one module. It owns the
// module's sharded parameters and carries out the FSDP2 protocol for them:
//
//   pre_forward    all-gather (unshard), prefetch the next unit, attach the
//                  backward node that will receive the unsharded gradients
//   post_forward   reshard if asked, hook pre_backward onto the outputs
//   pre_backward   all-gather again if resharded, prefetch the previous unit
//   post_backward  (all gradients of the unit are ready) reduce-scatter them
//                  on the gradient lane, free the unsharded parameters
//   finalize       (end of backward, root only) wait for reductions, write
//                  the shards' .grad, flush units whose backward never ran
//
// One flat buffer per direction: an all-gather input of this rank's shards,
// an unsharded buffer holding every parameter at full size (its storage is
// freed and re-allocated in place, so views that autograd saved stay valid),
// and a reduce-scatter input/output pair for gradients.
//
// Internal to core/fsdp: users reach it through fully_shard.h.
#ifndef FSDP2_CORE_FSDP_FSDP_UNIT_H_
#define FSDP2_CORE_FSDP_FSDP_UNIT_H_

#include <torch/nn/module.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/comm_handle.h"
#include "core/comm/process_group.h"
#include "core/fsdp/fully_shard.h"

namespace fsdp2 {
namespace fsdp {

// Time the training thread spent on one unit's communication since the last
// reset: blocked waiting for collectives that compute did not hide, and
// copying into the flat buffers. For benchmarks; costs two clock reads per
// wait.
struct CommWaitStats {
  double all_gather_wait_s = 0;  // unshard: all-gather and copy-out
  double reduce_wait_s = 0;      // gradient reduce-scatter / all-reduce
  double copy_in_s = 0;          // copy-in to the all-gather/reduce buffers
  int64_t all_gathers = 0;
  int64_t reductions = 0;
};

// One parameter owned by a unit.
struct FSDPParam {
  std::string name;  // relative to the unit's module, e.g. "attn.qkv.weight"
  // Every (module, registered name) that holds it: several for tied params.
  std::vector<std::pair<torch::nn::Module*, std::string>> slots;
  at::Tensor compute;  // the module's own tensor: full size while unsharded
  at::Tensor shard;    // this rank's rows: a leaf the optimizer updates
  std::vector<int64_t> global_shape;
  int64_t rows = 0;        // global dim-0 size (1 for a 0-d parameter)
  int64_t row_numel = 0;   // elements per row
  int64_t shard_rows = 0;  // rows per rank, padded: ceil(rows / world)
  int64_t local_rows = 0;  // rows this rank really holds (<= shard_rows)
  int64_t row_start = 0;    // first global row this rank holds
  int64_t flat_offset = 0;  // offset in the per-rank flat shard (elements)
  bool requires_grad = true;  // false: frozen, never gets a gradient

  int64_t shard_numel() const { return shard_rows * row_numel; }
  int64_t local_numel() const { return local_rows * row_numel; }
};

class FSDPUnit : public std::enable_shared_from_this<FSDPUnit> {
 public:
  FSDPUnit(const std::shared_ptr<torch::nn::Module>& module,
           const FSDPOptions& options, std::vector<FSDPParam> params);
  ~FSDPUnit();

  // The protocol (see the file comment).
  void pre_forward();
  at::Tensor cast_input(const at::Tensor& t) const;
  std::vector<at::Tensor> post_forward(std::vector<at::Tensor> outputs);
  void abort_forward();
  void pre_backward();
  // `node` is the node that received the gradients; stale nodes are ignored.
  // Takes the gradients: each is released as soon as it has been copied
  // into the reduction buffer.
  void post_backward(const torch::autograd::Node* node,
                     std::vector<at::Tensor> unsharded_grads);

  void set_requires_gradient_sync(bool sync) { requires_grad_sync_ = sync; }
  // Whether the shards are still meta tensors awaiting materialize_module()
  // (which clears it); a deferred unit refuses to run.
  bool deferred() const { return deferred_; }
  void set_deferred(bool deferred) { deferred_ = deferred; }
  const std::vector<FSDPParam>& params() const { return params_; }
  // Every unit in this unit's module tree, this one first, in module order.
  std::vector<FSDPUnit*> units_in_tree() const;
  const std::shared_ptr<comm::ProcessGroup>& shard_group() const {
    return shard_group_;
  }
  int shard_world() const { return shard_world_; }
  // Whether this rank is the first replica of its shards.
  bool primary_replica() const {
    return !replicate_group_ || replicate_group_->rank() == 0;
  }
  torch::nn::Module* module() const { return module_; }
  bool module_alive() const { return !module_alive_.expired(); }
  int64_t unsharded_bytes() const;  // 0 unless unsharded now
  int64_t buffer_bytes() const;     // size of the unsharded buffer
  int64_t unsharded_grad_bytes() const;
  const CommWaitStats& comm_wait_stats() const { return wait_stats_; }
  void reset_comm_wait_stats() { wait_stats_ = CommWaitStats(); }

 private:
  enum class State { kSharded, kUnshardPending, kUnsharded };

  void lazy_init_as_root();
  void unshard_async();  // start the all-gather (no-op unless sharded)
  void wait_unshard();   // finish it and point the compute tensors at it
  void reshard();        // free the unsharded parameters
  void attach_grad_node();
  void reduce_grads(std::vector<at::Tensor> grads);  // post_backward's core
  void queue_finalize();     // root's end-of-backward callback, once
  void finalize_backward();  // root: end-of-backward callback
  void finish_reduction();   // wait and write shard .grad
  void prefetch(int direction);

  torch::nn::Module* module_;
  std::weak_ptr<torch::nn::Module> module_alive_;
  FSDPOptions options_;
  std::vector<FSDPParam> params_;
  std::vector<size_t> grad_params_;  // params that require grad: node inputs
  std::shared_ptr<comm::ProcessGroup> shard_group_;      // null: world 1
  std::shared_ptr<comm::ProcessGroup> replicate_group_;  // null: world 1
  int shard_world_ = 1;
  int shard_rank_ = 0;
  int64_t data_parallel_size_ = 1;
  at::ScalarType param_dtype_;
  at::ScalarType reduce_dtype_;
  at::TensorOptions compute_options_;
  int64_t flat_numel_ = 0;  // per-rank flat shard, padded
  bool has_padding_ = false;
  // World 1 with no dtype change: compute tensors alias the shards.
  bool alias_shards_ = false;
  bool reshard_after_forward_ = true;
  bool requires_grad_sync_ = true;
  bool deferred_ = false;  // see deferred()

  State state_ = State::kSharded;
  at::Tensor unsharded_;  // [world * flat_numel_], storage freed when sharded
  comm::CommHandle unshard_done_;

  // Backward state for the current step.
  std::shared_ptr<torch::autograd::Node> grad_node_;
  bool grad_node_fired_ = false;
  bool pre_backward_done_ = false;
  std::vector<at::Tensor> no_sync_grads_;  // unsharded, reduce dtype
  at::Tensor reduced_grads_;               // [flat_numel_] after reduction
  comm::CommHandle reduce_done_;
  bool reduction_pending_ = false;

  // Root state.
  FSDPUnit* root_ = nullptr;  // set at the root's first forward
  bool is_root_ = false;
  std::vector<FSDPUnit*> all_units_;       // root only
  std::vector<FSDPUnit*> forward_order_;   // root only: this pass
  std::vector<FSDPUnit*> last_forward_order_;  // root only: previous pass
  std::vector<FSDPUnit*> post_forward_order_;  // root only: this pass
  bool finalize_queued_ = false;
  int order_index_ = -1;  // position in the root's last forward order

  CommWaitStats wait_stats_;
  // Root only: gradient reductions issued and not yet waited for, oldest
  // first; at most kMaxReductionsInFlight (a limit_all_gathers-style cap).
  // One: a reduction runs while the next unit computes its gradients, and
  // each further one would hold another unit-sized buffer.
  static constexpr size_t kMaxReductionsInFlight = 1;
  std::deque<FSDPUnit*> reductions_in_flight_;
};

// Every unit in `root`'s module tree (root included), in module order.
std::vector<FSDPUnit*> UnitsUnder(torch::nn::Module& root);

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_FSDP_UNIT_H_
