// fsdp2/core/strategy/fsdp2_strategy_stats.cc
//
// What FSDP2Strategy reports of itself: memory (StrategyMemoryStats) and,
// with CPU offload, what its host optimizer did (OffloadStats).
#include "core/fsdp/fully_shard.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/memory_stats.h"

namespace fsdp2 {
namespace strategy {

void FSDP2Strategy::wait_for_host_optimizer() const {
  if (host_optimizer_) host_optimizer_->drain();
}

StrategyMemoryStats FSDP2Strategy::memory_stats() const {
  require(/*setup=*/false, /*parallelized=*/true, "memory_stats");
  wait_for_host_optimizer();
  const fsdp::MemoryStats engine = fsdp::memory_stats(*module_->module());
  StrategyMemoryStats stats;
  stats.sharded_param_bytes = engine.sharded_param_bytes;
  stats.sharded_grad_bytes = engine.sharded_grad_bytes;
  stats.optimizer_state_bytes = optimizer_ ? OptimizerStateBytes(*optimizer_) : 0;
  stats.unsharded_param_bytes = engine.unsharded_param_bytes;
  stats.peak_unsharded_param_bytes = fsdp::peak_unsharded_param_bytes();
  stats.unsharded_grad_bytes = engine.unsharded_grad_bytes;
  stats.total_param_bytes = total_param_bytes_;
  const ResidentMemory resident = ProcessResidentMemory();
  stats.rss_bytes = resident.rss_bytes;
  stats.peak_rss_bytes = resident.peak_rss_bytes;
  AddDeviceMemory(device_, stats);
  return stats;
}

void FSDP2Strategy::reset_peak_memory_stats() {
  require(/*setup=*/false, /*parallelized=*/true, "reset_peak_memory_stats");
  ResetPeakResidentBytes();  // first: it is the one that can fail
  fsdp::reset_peak_unsharded_param_bytes();
  ResetPeakDeviceMemory(device_);
}

OffloadStats FSDP2Strategy::offload_stats() const {
  OffloadStats stats;
  if (!host_optimizer_) return stats;
  host_optimizer_->drain();
  stats.units_received = host_optimizer_->received();
  stats.units_stepped_in_backward = host_optimizer_->stepped_units();
  stats.norm_parts_taken = host_optimizer_->norm_parts_taken();
  stats.norm_parts_used = host_optimizer_->norm_parts().used();
  return stats;
}

}  // namespace strategy
}  // namespace fsdp2
