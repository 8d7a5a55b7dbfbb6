// fsdp2/core/fsdp/stats.h
//
// What the sharded modules hold and how long their communication made the
// training thread wait, read for logs and benchmarks: the bytes of the
// sharded modules under a root, the high-water mark of all-gathered
// parameters, the engine's buffer pool and each unit's communication waits.
// The values' types are in stats_types.h. fully_shard.h includes this
// header.
//
// Thread-safety: as fully_shard.h (one training thread per process), except
// where a function says otherwise.
#ifndef FSDP2_CORE_FSDP_STATS_H_
#define FSDP2_CORE_FSDP_STATS_H_

#include <torch/nn/module.h>

#include <cstdint>

#include "core/fsdp/stats_types.h"

namespace fsdp2 {
namespace fsdp {

// Per-rank bytes held by the sharded modules under `root`.
MemoryStats memory_stats(torch::nn::Module& root);
// High-water mark of all-gathered parameter bytes alive at once in this
// process since the last reset.
int64_t peak_unsharded_param_bytes();
// Restarts that high-water mark from the bytes alive now (process-wide).
void reset_peak_unsharded_param_bytes();

// The engine's buffer pool (see BufferPoolStats), and a way to give the
// buffers it keeps for the next step back to the system, e.g. after
// training. Thread-safe.
BufferPoolStats buffer_pool_stats();
// Frees the buffers the pool keeps for reuse (kept_bytes becomes 0); buffers
// in use are not touched and return to the pool when released.
void release_buffer_pool();

// The communication waits of `module`'s unit since its last reset. Throws
// std::invalid_argument if `module` is not sharded.
CommWaitStats comm_wait_stats(const torch::nn::Module& module);
// Resets the waits of every sharded module under `root`.
void reset_comm_wait_stats(torch::nn::Module& root);

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_STATS_H_
