// fsdp2/c_api/memory.cc
//
// Memory statistics of a strategy (fsdp2_memory_stats_t): a thin layer over
// FSDP2Strategy::memory_stats() (core/strategy/memory_stats.h).
#include <algorithm>
#include <cstring>
#include <string>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "c_api/internal/handles.h"
#include "core/strategy/fsdp2_strategy.h"

using namespace fsdp2::c_api;  // NOLINT: the entry points below are C

extern "C" {

void fsdp2_memory_stats_init(fsdp2_memory_stats_t* stats) {
  if (stats == nullptr) return;
  std::memset(static_cast<void*>(stats), 0, sizeof(*stats));
  stats->struct_size = sizeof(*stats);
}

fsdp2_status_t fsdp2_strategy_memory_stats(const fsdp2_strategy_t* strategy,
                                           fsdp2_memory_stats_t* stats) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(stats, "stats");
  const size_t caller_size = stats->struct_size;
  Require(caller_size >= sizeof(size_t),
          "stats.struct_size is " + std::to_string(caller_size) +
              "; set it to sizeof(fsdp2_memory_stats_t) (call fsdp2_memory_stats_init first)");
  RequireParallelized(*s, "fsdp2_strategy_memory_stats");
  const fsdp2::strategy::StrategyMemoryStats m = s->strategy->memory_stats();
  fsdp2_memory_stats_t out;
  fsdp2_memory_stats_init(&out);
  out.sharded_param_bytes = m.sharded_param_bytes;
  out.sharded_grad_bytes = m.sharded_grad_bytes;
  out.optimizer_state_bytes = m.optimizer_state_bytes;
  out.unsharded_param_bytes = m.unsharded_param_bytes;
  out.peak_unsharded_param_bytes = m.peak_unsharded_param_bytes;
  out.unsharded_grad_bytes = m.unsharded_grad_bytes;
  out.total_param_bytes = m.total_param_bytes;
  out.rss_bytes = m.rss_bytes;
  out.peak_rss_bytes = m.peak_rss_bytes;
  out.device_allocated_bytes = m.device_allocated_bytes;
  out.device_reserved_bytes = m.device_reserved_bytes;
  out.peak_device_allocated_bytes = m.peak_device_allocated_bytes;
  out.peak_device_reserved_bytes = m.peak_device_reserved_bytes;
  // As many bytes as the caller's struct has: an older caller gets the
  // fields it knows; struct_size stays the caller's.
  std::memcpy(static_cast<void*>(stats), &out, std::min(caller_size, sizeof(out)));
  stats->struct_size = caller_size;
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_reset_peak_memory_stats(fsdp2_strategy_t* strategy) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  RequireParallelized(*s, "fsdp2_strategy_reset_peak_memory_stats");
  s->strategy->reset_peak_memory_stats();
  FSDP2_API_END
}

}  // extern "C"
