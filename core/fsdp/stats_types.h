// fsdp2/core/fsdp/stats_types.h
//
// What the sharded modules hold and how long their communication made the
// training thread wait: plain values that stats.h's memory_stats(),
// comm_wait_stats() and buffer_pool_stats() return, for logs and benchmarks.
// Apart from stats.h so that the engine (internal/) can fill them without
// the API built on it.
#ifndef FSDP2_CORE_FSDP_STATS_TYPES_H_
#define FSDP2_CORE_FSDP_STATS_TYPES_H_

#include <cstdint>

namespace fsdp2 {
namespace fsdp {

// Per-rank bytes held by the sharded modules under a root.
struct MemoryStats {
  int64_t sharded_param_bytes = 0;    // local shards (optimizer's params)
  int64_t sharded_grad_bytes = 0;     // local shards' .grad, and reduced
                                      // gradients held back for an all-reduce
                                      // (set_requires_all_reduce)
  int64_t unsharded_param_bytes = 0;  // all-gathered params alive now
  int64_t unsharded_grad_bytes = 0;   // accumulated no-sync gradients
  int64_t total_param_numel = 0;      // global (unsharded) parameter count
};

// Time the training thread spent on one sharded module's communication since
// the last reset: blocked waiting for collectives that compute did not hide,
// and copying into the flat buffers. Costs two clock reads per wait.
struct CommWaitStats {
  double all_gather_wait_s = 0;  // unshard: all-gather and copy-out
  double reduce_wait_s = 0;      // gradient reduce-scatter / all-reduce
  double copy_in_s = 0;          // copy-in to the all-gather/reduce buffers
  int64_t all_gathers = 0;
  int64_t reductions = 0;
};

// The engine's pool of unit-sized host buffers (unsharded parameters,
// gradient reduction buffers), process-wide. In steady-state training
// `allocations` stops growing: every step reuses the buffers of the last.
struct BufferPoolStats {
  int64_t allocations = 0;   // buffers taken from the system
  int64_t reuses = 0;        // requests served by a kept buffer
  int64_t in_use_bytes = 0;  // handed out, not yet freed
  int64_t kept_bytes = 0;    // freed, kept for the next request of their size
  int64_t lent = 0;          // kept buffers lent to checkpointed units'
                             // recomputations (their activations and
                             // gradients), back when those are freed
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_STATS_TYPES_H_
