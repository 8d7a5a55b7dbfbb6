#include "core/fsdp/stats.h"

#include "core/common/error.h"
#include "core/fsdp/fully_shard.h"
#include "core/fsdp/internal/buffer_pool.h"
#include "core/fsdp/internal/fsdp_param.h"
#include "core/fsdp/internal/fsdp_param_group.h"
#include "core/fsdp/internal/fsdp_unit.h"
#include "core/fsdp/internal/unit_registry.h"

namespace fsdp2 {
namespace fsdp {

MemoryStats memory_stats(torch::nn::Module& root) {
  MemoryStats stats;
  for (FSDPUnit* unit : UnitsUnder(root)) {
    const FSDPParamGroup& group = unit->param_group();
    for (const FSDPParam& p : group.params()) {
      stats.sharded_param_bytes += p.shard().nbytes();
      if (p.shard().grad().defined()) {
        stats.sharded_grad_bytes += p.shard().grad().nbytes();
      }
      stats.total_param_numel += p.global_numel();
    }
    stats.sharded_grad_bytes += group.partial_grad_bytes();
    stats.unsharded_param_bytes += group.unsharded_bytes();
    stats.unsharded_grad_bytes += group.unsharded_grad_bytes();
  }
  return stats;
}

int64_t peak_unsharded_param_bytes() { return PeakUnshardedBytes(); }
void reset_peak_unsharded_param_bytes() { ResetPeakUnshardedBytes(); }

BufferPoolStats buffer_pool_stats() { return internal::BufferPool::Get().stats(); }
void release_buffer_pool() { internal::BufferPool::Get().release(); }

CommWaitStats comm_wait_stats(const torch::nn::Module& module) {
  auto unit = unit_of(module);
  if (!unit) {
    throw InvalidArgumentError("comm_wait_stats: module '" + module.name() +
                                "' is not sharded; pass a module that "
                                "fully_shard was applied to");
  }
  return unit->param_group().comm_wait_stats();
}

void reset_comm_wait_stats(torch::nn::Module& root) {
  for (FSDPUnit* unit : UnitsUnder(root)) {
    unit->param_group().reset_comm_wait_stats();
  }
}

}  // namespace fsdp
}  // namespace fsdp2
