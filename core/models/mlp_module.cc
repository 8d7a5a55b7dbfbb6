#include "core/models/mlp_module.h"
#include "core/common/error.h"

#include <torch/nn/functional/loss.h>

#include <sstream>
#include <stdexcept>

#include "core/fsdp/fully_shard.h"

namespace fsdp2 {
namespace models {
namespace F = torch::nn::functional;

MLPModule::MLPModule(const MLPConfig& config, const strategy::OptimizerOptions& optimizer,
                     std::optional<at::ScalarType> dtype)
    : config_(config), mlp_(config), optimizer_(optimizer) {
  if (dtype) mlp_->to(*dtype);
}

at::Tensor MLPModule::training_step(const strategy::Batch& batch, int64_t) {
  return loss(batch);
}

at::Tensor MLPModule::validation_step(const strategy::Batch& batch, int64_t) {
  return loss(batch);
}

at::Tensor MLPModule::predict_step(const strategy::Batch& batch, int64_t) {
  if (batch.empty()) throw InvalidArgumentError("MLPModule: predict_step needs {x}");
  return fsdp::forward(mlp_, batch[0]);
}

std::unique_ptr<torch::optim::Optimizer> MLPModule::configure_optimizers() {
  return strategy::MakeOptimizer(mlp_->parameters(), optimizer_);
}

at::Tensor MLPModule::loss(const strategy::Batch& batch) {
  if (batch.size() < 2) {
    throw InvalidArgumentError("MLPModule: a batch is {x, y}, got " +
                                std::to_string(batch.size()) + " tensor(s)");
  }
  const at::Tensor out = fsdp::forward(mlp_, batch[0]);
  const at::Tensor& y = batch[1];
  std::ostringstream error;
  if (!y.is_floating_point()) {
    if (y.dim() == 1 && y.size(0) == out.size(0)) {
      return F::cross_entropy(out, y.to(at::kLong));
    }
    error << "MLPModule: class targets must be [B] = [" << out.size(0) << "], got "
          << y.sizes();
  } else {
    if (y.sizes() == out.sizes()) return F::mse_loss(out, y.to(out.scalar_type()));
    error << "MLPModule: regression targets must have the output's shape "
          << out.sizes() << ", got " << y.sizes();
  }
  throw InvalidArgumentError(error.str());
}

}  // namespace models
}  // namespace fsdp2
