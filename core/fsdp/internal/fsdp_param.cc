#include "core/fsdp/internal/fsdp_param.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/fsdp/assign_data.h"
#include "core/fsdp/internal/host_offload.h"
#include "core/fsdp/internal/module_access.h"

namespace fsdp2 {
namespace fsdp {
namespace {

// `shape` with its first dimension replaced by `rows` (a 0-d shape gains one).
std::vector<int64_t> WithRows(int64_t rows, const std::vector<int64_t>& shape) {
  std::vector<int64_t> out{rows};
  if (!shape.empty()) out.insert(out.end(), shape.begin() + 1, shape.end());
  return out;
}

}  // namespace

FSDPParam::FSDPParam(std::string name, at::Tensor tensor)
    : name_(std::move(name)),
      compute_(std::move(tensor)),
      requires_grad_(compute_.requires_grad()) {}

void FSDPParam::add_slot(torch::nn::Module* module, const std::string& key) {
  std::pair<torch::nn::Module*, std::string> slot{module, key};
  if (std::find(slots_.begin(), slots_.end(), slot) == slots_.end()) {
    slots_.push_back(std::move(slot));
  }
}

void FSDPParam::init_layout(int world, int rank, int64_t flat_offset) {
  global_shape_ = compute_.sizes().vec();
  rows_ = global_shape_.empty() ? 1 : global_shape_[0];
  row_numel_ = 1;  // the product of the dims after the first
  for (size_t d = 1; d < global_shape_.size(); ++d) row_numel_ *= global_shape_[d];
  shard_rows_ = (rows_ + world - 1) / world;
  row_start_ = std::min(rank * shard_rows_, rows_);
  local_rows_ = std::min(shard_rows_, rows_ - row_start_);
  flat_offset_ = flat_offset;
}

std::vector<int64_t> FSDPParam::shard_shape() const {
  return WithRows(local_rows_, global_shape_);
}

void FSDPParam::init_shard(const at::TensorOptions& compute_options, bool host_shard,
                           bool pin_memory) {
  host_shard_ = host_shard;
  pin_memory_ = pin_memory;
  const at::Tensor rows = local_rows_of(compute_.detach());
  at::Tensor shard;
  if (host_shard_ && !rows.is_meta()) {
    shard = internal::EmptyHost(shard_shape(), shard_options(rows.device()));
    shard.view(rows.sizes()).copy_(rows);
  } else {
    shard = rows.clone().view(shard_shape());
  }
  shard.set_requires_grad(requires_grad_);
  shard_ = shard;
  for (auto& slot : slots_) {
    internal::ModuleAccess::Parameters(*slot.first)[slot.second] = shard;
  }
  compute_.set_requires_grad(false);
  assign_data(compute_, at::empty({0}, compute_options));
}

at::TensorOptions FSDPParam::shard_options(const at::Device& to) const {
  const at::TensorOptions own = compute_.options().device(to);
  if (!host_shard_) return own;
  // Page-locked memory serves copies to a device only.
  return own.device(at::kCPU).pinned_memory(pin_memory_ && !to.is_cpu());
}

at::Tensor FSDPParam::local_rows_of(const at::Tensor& full) const {
  return full.reshape({rows_, row_numel_}).narrow(0, row_start_, local_rows_);
}

at::Tensor FSDPParam::chunk_of(const at::Tensor& unsharded, int world,
                               int rank) const {
  return unsharded.narrow(0, world * flat_offset_ + rank * shard_numel(),
                          shard_numel());
}

void FSDPParam::copy_shard_to(const at::Tensor& chunk, const at::Tensor& source) const {
  const int64_t numel = shard_numel(), local = local_numel();
  const at::Tensor& from = source.defined() ? source : shard_;
  if (local > 0) chunk.narrow(0, 0, local).copy_(from.detach().reshape({-1}));
  if (local < numel) chunk.narrow(0, local, numel - local).zero_();
}

at::Tensor FSDPParam::unsharded_view(const at::Tensor& unsharded,
                                     int world) const {
  return unsharded.narrow(0, world * flat_offset_, world * shard_numel())
      .view(WithRows(world * shard_rows_, global_shape_))
      .narrow(0, 0, rows_)
      .view(global_shape_);
}

void FSDPParam::copy_grad_to(const at::Tensor& grad,
                             const at::Tensor& by_rank) const {
  const int64_t numel = shard_numel();
  if (numel == 0) return;
  at::Tensor g = grad.reshape({-1});
  at::Tensor target = by_rank.narrow(1, flat_offset_, numel);
  // Ranks whose chunk is all rows, then the one chunk that is partly rows.
  const int64_t full_chunks = rows_ / shard_rows_;
  const int64_t rest = global_numel() - full_chunks * numel;
  if (full_chunks > 0) {
    target.narrow(0, 0, full_chunks)
        .copy_(g.narrow(0, 0, full_chunks * numel).view({full_chunks, numel}));
  }
  if (rest > 0) {
    target[full_chunks].narrow(0, 0, rest).copy_(
        g.narrow(0, full_chunks * numel, rest));
  }
}

at::Tensor FSDPParam::reduced_grad_view(const at::Tensor& reduced) const {
  return reduced.narrow(0, flat_offset_, local_numel()).view(shard_.sizes());
}

void FSDPParam::point_compute_at_unsharded(const at::Tensor& unsharded,
                                           int world) {
  compute_.set_data(unsharded_view(unsharded, world));
}

void FSDPParam::point_compute_at_shard() {
  compute_.set_data(shard_.detach().view(global_shape_));
}

void FSDPParam::free_compute(const at::TensorOptions& compute_options) {
  compute_.set_data(at::empty({0}, compute_options));
}

void FSDPParam::accumulate_grad(const at::Tensor& grad) {
  at::Tensor& own = shard_.mutable_grad();
  if (own.defined()) {
    own.add_(grad);
  } else {
    own = grad.to(shard_.scalar_type(), /*non_blocking=*/false, /*copy=*/true,
                  at::MemoryFormat::Contiguous);
  }
}

}  // namespace fsdp
}  // namespace fsdp2
