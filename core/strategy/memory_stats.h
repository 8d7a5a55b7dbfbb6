// fsdp2/core/strategy/memory_stats.h
//
// What one rank of a training job holds in memory, as FSDP2Strategy's
// memory_stats() reports it: the sharded engine's bytes (core/fsdp/stats.h),
// the optimizer's state, the model's global size and the process's resident
// memory. Plain values for logs, benchmarks and the C ABI
// (fsdp2_strategy_memory_stats).
#ifndef FSDP2_CORE_STRATEGY_MEMORY_STATS_H_
#define FSDP2_CORE_STRATEGY_MEMORY_STATS_H_

#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <cstdint>

namespace fsdp2 {
namespace strategy {

// Per-rank bytes. "Sharded" means this rank's rows of the FSDP-managed
// parameters (with NO_SHARD or one rank: all of them).
struct StrategyMemoryStats {
  int64_t sharded_param_bytes = 0;   // local parameter shards (the optimizer's)
  int64_t sharded_grad_bytes = 0;    // their .grad (0 but between a backward and its step)
  int64_t optimizer_state_bytes = 0; // the optimizer's state tensors on this rank
  // Full-size parameter copies alive now that units compute with: gathered
  // shards, or bf16 casts under mixed precision (also on one rank and with
  // NO_SHARD), in the compute dtype. 0 in fp32 on one rank or with NO_SHARD.
  int64_t unsharded_param_bytes = 0;
  // High-water mark of unsharded_param_bytes since parallelize() or the last
  // reset_peak_memory_stats(). Process-wide: every sharded module of the
  // process counts.
  int64_t peak_unsharded_param_bytes = 0;
  int64_t unsharded_grad_bytes = 0;  // gradients kept unsharded (no-sync accumulation)
  // The whole model's parameters, unsharded, in their own dtype (the fp32
  // masters under mixed precision), tied parameters once: the same on every rank.
  int64_t total_param_bytes = 0;
  int64_t rss_bytes = 0;       // the process's resident memory now (VmRSS)
  // The process's peak resident memory (VmHWM): since it started, or since
  // the last reset_peak_memory_stats().
  int64_t peak_rss_bytes = 0;
  // On a GPU (the strategy's device), from PyTorch's caching allocator for
  // that device: bytes in tensors now, bytes it holds from the driver now
  // (tensors and its cache), and their peaks since parallelize() or the
  // last reset_peak_memory_stats(). All 0 on the CPU.
  int64_t device_allocated_bytes = 0;
  int64_t device_reserved_bytes = 0;  // held from the driver: tensors and cache
  int64_t peak_device_allocated_bytes = 0;  // the most device_allocated_bytes
  int64_t peak_device_reserved_bytes = 0;  // the most device_reserved_bytes
};

// Bytes of the tensors in `optimizer`'s per-parameter state (Adam(W):
// exp_avg, exp_avg_sq and max_exp_avg_sq when amsgrad; SGD: the momentum
// buffer; Adagrad, RMSprop likewise); 0 before its first step. A state of
// another type (LBFGS, a user's optimizer) is counted through its
// serialization: the tensors it writes.
int64_t OptimizerStateBytes(const torch::optim::Optimizer& optimizer);

// The process's resident memory now (VmRSS) and its peak (VmHWM), read
// together from /proc/self/status (so peak >= now); 0 where that file is
// missing (not Linux).
struct ResidentMemory {
  int64_t rss_bytes = 0;  // VmRSS: resident now
  int64_t peak_rss_bytes = 0;  // VmHWM: the most resident since start or reset
};
// Reads both from /proc/self/status (zeros where it is missing or
// unreadable; it reports no error). Cheap: one small file read.
ResidentMemory ProcessResidentMemory();
// The caching allocator's statistics of `device` (a GPU; nothing for the
// CPU): fills the device_* fields of `stats`.
void AddDeviceMemory(const at::Device& device, StrategyMemoryStats& stats);
// Restarts the allocator's peaks of `device` from what it holds now (nothing
// for the CPU).
void ResetPeakDeviceMemory(const at::Device& device);
// Resets the peak (VmHWM) to the current resident memory, by writing "5"
// to /proc/self/clear_refs (Linux 4.0+). Throws IoError if that file
// cannot be written (an older kernel, a restricted /proc).
void ResetPeakResidentBytes();

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_MEMORY_STATS_H_
