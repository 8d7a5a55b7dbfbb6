// fsdp2/core/strategy/fsdp2_strategy_collectives.cc
//
// FSDP2Strategy's collectives a caller issues: explicit unshard and reshard
// of one sharded module by name (fsdp::unshard, fsdp::reshard), and the
// barrier, broadcast and data-parallel reduce over its process groups.
#include <ATen/ATen.h>

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

void FSDP2Strategy::barrier() {
  require(true, false, "barrier");
  world_->group()->barrier().wait();
}

void FSDP2Strategy::broadcast(at::Tensor& tensor, int src) {
  require(true, false, "broadcast");
  at::Tensor buffer = tensor.contiguous();
  world_->group()->broadcast(buffer, src).wait();
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

at::Tensor FSDP2Strategy::reduce(const at::Tensor& tensor, bool mean) {
  require(true, false, "reduce");
  at::Tensor out = tensor.detach().clone().contiguous();
  mesh_->group("dp")->all_reduce(out).wait();
  if (mean) out.div_(dp_size_);
  return out;
}

}  // namespace strategy
}  // namespace fsdp2
