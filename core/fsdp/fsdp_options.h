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

#include "core/comm/device_mesh.h"
#include "core/fsdp/mixed_precision.h"

namespace fsdp2 {
namespace fsdp {

enum class ShardingStrategy {
  kFullShard,    // shard params/grads/optimizer state; reshard after forward
  kShardGradOp,  // as kFullShard, but keep params unsharded until backward
  kNoShard,      // replicate params, all-reduce grads (DDP equivalent)
  kHybridShard,  // 2-D mesh: shard within a group, all-reduce across groups
};

const char* ToString(ShardingStrategy s);
// Parses full_shard, shard_grad_op, no_shard, hybrid_shard (any case; '-'
// or '_'). Throws std::invalid_argument naming the accepted values.
ShardingStrategy ParseShardingStrategy(const std::string& name);

struct FSDPOptions {
  // The ranks to shard over. kFullShard/kShardGradOp shard over a 1-D mesh's
  // only dim (or `shard_dim`), kNoShard replicates over it, kHybridShard needs
  // a 2-D mesh (replicate_dim, shard_dim); default dims: first is replicate,
  // last is shard.
  std::shared_ptr<comm::DeviceMesh> mesh;
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  std::string shard_dim;      // default: last mesh dim
  std::string replicate_dim;  // default: first mesh dim (kHybridShard only)
  // Free the unsharded parameters after this module's forward. Default: true
  // for kFullShard and kHybridShard, false otherwise. The root module (the
  // outermost sharded module) never reshards after forward: its backward
  // starts right away.
  c10::optional<bool> reshard_after_forward;
  MixedPrecisionPolicy mp_policy;
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_FSDP_OPTIONS_H_
