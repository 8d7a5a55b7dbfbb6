// fsdp2/core/strategy/distributed_sampler.h
//
// DistributedSampler: which dataset rows each rank trains on.
//
// Each epoch visits the dataset in one order (a permutation drawn from
// (seed, epoch) when shuffling, else 0..n-1), cut into global batches of
// `global_batch_size` rows. Rank r of W takes rows [r * B, (r + 1) * B) of
// each global batch, B = global_batch_size / W. The sequence of global
// batches depends only on the dataset size, seed, epoch and global batch size,
// never on W: runs with different numbers of ranks see the same data, which
// is what makes them comparable (and resumable on another world size).
//
// A final partial global batch is dropped (drop_last) or completed with rows
// from the start of the epoch's order (pad), as PyTorch's sampler pads.
#ifndef FSDP2_CORE_STRATEGY_DISTRIBUTED_SAMPLER_H_
#define FSDP2_CORE_STRATEGY_DISTRIBUTED_SAMPLER_H_

#include <cstdint>
#include <vector>

namespace fsdp2 {
namespace strategy {

// How a DistributedSampler cuts the dataset into global batches.
struct DistributedSamplerOptions {
  int64_t global_batch_size = 1;  // rows per step over all ranks; default 1
  bool shuffle = true;  // a new permutation each epoch (default) or 0..n-1
  uint64_t seed = 0;  // with the epoch, decides the permutation; default 0
  bool drop_last = true;  // drop a last partial batch (default) or pad it
};

// This rank's share of each global batch (see the file comment). Copyable;
// not thread-safe while set_epoch runs.
class DistributedSampler {
 public:
  // Throws std::invalid_argument if the sizes are not positive, rank is out
  // of range, or global_batch_size is not a multiple of world_size.
  DistributedSampler(int64_t dataset_size, int rank, int world_size,
                     const DistributedSamplerOptions& options);

  // Draws `epoch`'s order (from seed and epoch alone when shuffling): the
  // same on every rank. The constructor starts at epoch 0.
  void set_epoch(int64_t epoch);
  // The epoch the current order belongs to.
  int64_t epoch() const { return epoch_; }
  int64_t num_batches() const;  // global batches per epoch
  // This rank's rows per global batch: global_batch_size / world_size.
  int64_t local_batch_size() const { return local_batch_; }
  // This rank's rows of global batch `batch` of the current epoch.
  std::vector<int64_t> local_batch(int64_t batch) const;
  // All rows of global batch `batch`, in rank order.
  std::vector<int64_t> global_batch(int64_t batch) const;

 private:
  int64_t dataset_size_;
  int rank_;
  int world_size_;
  DistributedSamplerOptions options_;
  int64_t local_batch_;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;  // this epoch's visiting order
};

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_DISTRIBUTED_SAMPLER_H_
