#include "core/fsdp/offload.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Event.h>

namespace fsdp2 {
namespace fsdp {

HostGradients::HostGradients(std::vector<at::Tensor> shards, at::Device device)
    : shards_(std::move(shards)), device_(device) {}

HostGradients::~HostGradients() {
  // Never free host memory a copy may still be writing.
  if (copied_ && !applied_) copied_->synchronize();
}

void HostGradients::add(at::Tensor shard, at::Tensor grad) {
  grads_.emplace_back(std::move(shard), std::move(grad));
}

void HostGradients::copied(const c10::Stream& stream) {
  if (stream.device().is_cpu()) return;
  copied_ = std::make_unique<c10::Event>(stream.device_type());
  copied_->record(stream);
}

void HostGradients::apply() {
  std::lock_guard<std::mutex> lock(mu_);
  if (applied_) return;
  applied_ = true;
  if (copied_) copied_->synchronize();
  at::NoGradGuard no_grad;
  for (auto& [shard, grad] : grads_) {
    at::Tensor& own = shard.mutable_grad();
    if (own.defined()) {
      own.add_(grad);
    } else if (grad.scalar_type() == shard.scalar_type()) {
      own = std::move(grad);  // host memory of its own already
    } else {
      own = grad.to(shard.scalar_type(), /*non_blocking=*/false, /*copy=*/true,
                    at::MemoryFormat::Contiguous);
    }
  }
  grads_.clear();
}

int64_t HostGradients::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& entry : grads_) {
    if (entry.second.defined()) n += static_cast<int64_t>(entry.second.nbytes());
  }
  return n;
}

}  // namespace fsdp
}  // namespace fsdp2
