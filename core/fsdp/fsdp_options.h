// fsdp2/core/fsdp/fsdp_options.h
//
// FSDPOptions: how fully_shard() shards a module (the mesh, the sharding
// strategy, resharding after forward, mixed precision). Included by
// fully_shard.h; a header of its own so that the engine under internal/ can
// use the options without the API that is built on it.
#ifndef FSDP2_CORE_FSDP_FSDP_OPTIONS_H_
#define FSDP2_CORE_FSDP_FSDP_OPTIONS_H_

#include <c10/util/Optional.h>

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/comm/device_mesh.h"
#include "core/fsdp/mixed_precision.h"

namespace fsdp2 {
namespace fsdp {

// What a unit shards and when it reshards (PyTorch's ShardingStrategy).
enum class ShardingStrategy {
  kFullShard,    // shard params/grads/optimizer state; reshard after forward
  kShardGradOp,  // as kFullShard, but keep params unsharded until backward
  kNoShard,      // replicate params, all-reduce grads (DDP equivalent)
  kHybridShard,  // 2-D mesh: shard within a group, all-reduce across groups
};

// "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD" or "HYBRID_SHARD" (static
// storage), for logs; ParseShardingStrategy reads these back.
const char* ToString(ShardingStrategy s);
// Parses full_shard, shard_grad_op, no_shard, hybrid_shard (any case; '-'
// or '_'). Throws std::invalid_argument naming the accepted values.
ShardingStrategy ParseShardingStrategy(const std::string& name);

// CPU offload (PyTorch: CPUOffloadPolicy). With `cpu_offload`, a unit's
// sharded parameters (the optimizer's leaves), their gradients and so the
// optimizer's state live in host memory, and the device holds only what is
// in flight: the unsharded parameters of the units being computed, the
// activations and the reduction buffers.
//  - Unsharding copies the shards host to device (on a copy stream, ahead
//    of the all-gather, as deep as the all-gathers are prefetched) and
//    casts them to param_dtype there.
//  - A unit's reduced gradients are copied device to host (on the copy
//    stream) and handed over as one HostGradients (core/fsdp/offload.h):
//    to the sink set_host_gradient_sink() installed (FSDP2Strategy's host
//    optimizer, which steps the unit while backward goes on), or, with no
//    sink, added to the shards' .grad before the hook returns.
// On the CPU the CPU stands in for the device: the shards are copied to
// their own buffers and the gradients to host tensors of their own, every
// step of the path runs, and training is bit-identical to no offload.
struct OffloadPolicy {
  bool cpu_offload = false;  // default off
  // Host buffers in page-locked memory, so copies run asynchronously with
  // the device's work (PyTorch's pin_memory); where pinning fails, pageable
  // memory. Ignored on the CPU; default true.
  bool pin_memory = true;
};

// How fully_shard() shards one module (a unit); each field's default below.
struct FSDPOptions {
  // The ranks to shard over. kFullShard/kShardGradOp shard over a 1-D mesh's
  // only dim (or `shard_dim`), kNoShard replicates over it, kHybridShard needs
  // a 2-D mesh (replicate_dim, shard_dim); default dims: first is replicate,
  // last is shard.
  std::shared_ptr<comm::DeviceMesh> mesh;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;  // default: full shard
  std::string shard_dim;      // default: last mesh dim
  std::string replicate_dim;  // default: first mesh dim (kHybridShard only)
  // Free the unsharded parameters after this module's forward. Default: true
  // for kFullShard and kHybridShard, false otherwise. The root module (the
  // outermost sharded module) never reshards after forward: its backward
  // starts right away.
  c10::optional<bool> reshard_after_forward;
  // Reshard after forward only down to groups of this many consecutive
  // ranks of the shard group (PyTorch's reshard_after_forward=int, ZeRO++'s
  // hpZ): a positive divisor of the shard group size. 0: as
  // reshard_after_forward says. 1: full resharding (true); the shard group
  // size: none (false). In between, after forward each rank keeps
  // shard size / k of the unit's shards (the rows its k-rank group needs),
  // and backward's all-gather runs inside that group only: with the ranks
  // of a host as the group, no parameter crosses hosts in backward. Costs
  // that much more memory between forward and backward. Overrides
  // reshard_after_forward; std::invalid_argument from fully_shard() when it
  // does not divide the shard group.
  int reshard_after_forward_size = 0;
  MixedPrecisionPolicy mp_policy;  // default: none (the parameters' dtype)

  // ---- controls (PyTorch's fully_shard has the same ones)
  // Prefetch depth, read from the root's options for its whole tree: how
  // many units ahead forward (and backward) all-gather while a unit
  // computes. 0: each unit all-gathers when it is reached (least memory,
  // every all-gather exposed); 1 (default): the next unit's all-gather
  // overlaps this one's compute; d: up to d further units' parameters are
  // unsharded beside the running one (d more unit-sized buffers at the
  // peak, for hiding all-gathers slower than one unit's compute).
  // Negative: std::invalid_argument from fully_shard(). A unit given its
  // own list (fsdp::set_modules_to_forward_prefetch) follows that instead.
  int forward_prefetch = 1;
  int backward_prefetch = 1;  // the same for backward, in reverse order; default 1
  // Reduced gradients are divided by this (default: the data-parallel
  // size, shard group x replicas, so a mean loss per rank gives the
  // gradient of the global mean). 1 sums the ranks' gradients. Must be
  // positive.
  c10::optional<double> gradient_divide_factor;
  // Parameters of the module's subtree that this unit leaves alone: not
  // sharded, never all-gathered or reduced; each rank keeps its own full
  // copy and its .grad is this rank's own gradient: all-reduce it yourself
  // after the backward that syncs. Matched by tensor identity (tensors that
  // are not the module's are passed over, so one list can serve every
  // unit). Under mp_policy each one that param_dtype would cast is cast
  // with the unit (PyTorch leaves them alone, so a bf16 block with an
  // ignored float32 bias fails there): from the unit's forward to the end
  // of its backward the parameter's data is a param_dtype copy of its
  // value, then its own value again; it stays the same tensor, its value,
  // .grad and optimizer state in its own dtype. A forward without
  // gradients restores it at once.
  std::vector<at::Tensor> ignored_params;
  // Where the unit's shards, gradients and optimizer state live (see
  // OffloadPolicy); default: with the parameters, no offload.
  OffloadPolicy offload_policy;
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_FSDP_OPTIONS_H_
