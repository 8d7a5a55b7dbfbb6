// fsdp2/core/strategy/fsdp2_strategy_unshard.cc
//
// FSDP2Strategy's explicit unshard and reshard of one sharded module by
// name (fsdp::unshard, fsdp::reshard).
#include <string>

#include "core/fsdp/fully_shard.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/fsdp_controls.h"

namespace fsdp2 {
namespace strategy {

fsdp::UnshardHandle FSDP2Strategy::unshard(const std::string& module_name, bool async_op) {
  require(/*setup=*/true, /*parallelized=*/true, "unshard");
  return fsdp::unshard(*ShardedModuleByName(*module_->module(), module_name, "unshard"),
                       async_op);
}

void FSDP2Strategy::reshard(const std::string& module_name) {
  require(/*setup=*/true, /*parallelized=*/true, "reshard");
  fsdp::reshard(*ShardedModuleByName(*module_->module(), module_name, "reshard"));
}

}  // namespace strategy
}  // namespace fsdp2
