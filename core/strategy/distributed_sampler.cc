#include "core/strategy/distributed_sampler.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>
#include <string>

namespace fsdp2 {
namespace strategy {

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank,
                                       int world_size,
                                       const DistributedSamplerOptions& options)
    : dataset_size_(dataset_size),
      rank_(rank),
      world_size_(world_size),
      options_(options) {
  if (dataset_size < 1) {
    throw InvalidArgumentError("DistributedSampler: the dataset is empty");
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InvalidArgumentError("DistributedSampler: rank " +
                                std::to_string(rank) + " of world size " +
                                std::to_string(world_size));
  }
  if (options.global_batch_size < 1 ||
      options.global_batch_size % world_size != 0) {
    throw InvalidArgumentError(
        "DistributedSampler: global batch size " +
        std::to_string(options.global_batch_size) +
        " must be a positive multiple of the data-parallel size " +
        std::to_string(world_size));
  }
  local_batch_ = options.global_batch_size / world_size;
  set_epoch(0);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  at::Tensor order;
  if (options_.shuffle) {
    auto gen = at::detail::createCPUGenerator(options_.seed * 1000003 + epoch);
    order = at::randperm(dataset_size_, gen, at::TensorOptions().dtype(at::kLong));
  } else {
    order = at::arange(dataset_size_, at::kLong);
  }
  order_.assign(order.data_ptr<int64_t>(), order.data_ptr<int64_t>() + dataset_size_);
}

int64_t DistributedSampler::num_batches() const {
  const int64_t B = options_.global_batch_size;
  return options_.drop_last ? dataset_size_ / B : (dataset_size_ + B - 1) / B;
}

std::vector<int64_t> DistributedSampler::global_batch(int64_t batch) const {
  if (batch < 0 || batch >= num_batches()) {
    throw OutOfRangeError("DistributedSampler: batch " + std::to_string(batch) +
                            " of an epoch of " + std::to_string(num_batches()));
  }
  std::vector<int64_t> rows(options_.global_batch_size);
  for (int64_t i = 0; i < options_.global_batch_size; ++i) {
    rows[i] = order_[(batch * options_.global_batch_size + i) % dataset_size_];
  }
  return rows;
}

std::vector<int64_t> DistributedSampler::local_batch(int64_t batch) const {
  std::vector<int64_t> all = global_batch(batch);
  return std::vector<int64_t>(all.begin() + rank_ * local_batch_,
                              all.begin() + (rank_ + 1) * local_batch_);
}

}  // namespace strategy
}  // namespace fsdp2
