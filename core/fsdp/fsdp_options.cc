#include "core/fsdp/fsdp_options.h"
#include "core/common/error.h"

#include <cctype>
#include <stdexcept>

namespace fsdp2 {
namespace fsdp {

const char* ToString(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard: return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard: return "NO_SHARD";
    case ShardingStrategy::kHybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

ShardingStrategy ParseShardingStrategy(const std::string& name) {
  std::string key;
  for (char c : name) key += c == '-' ? '_' : static_cast<char>(std::tolower(c));
  if (key == "full_shard") return ShardingStrategy::kFullShard;
  if (key == "shard_grad_op") return ShardingStrategy::kShardGradOp;
  if (key == "no_shard") return ShardingStrategy::kNoShard;
  if (key == "hybrid_shard") return ShardingStrategy::kHybridShard;
  throw InvalidArgumentError("unknown sharding strategy '" + name +
                              "' (expected full_shard, shard_grad_op, "
                              "no_shard or hybrid_shard)");
}

}  // namespace fsdp
}  // namespace fsdp2
