// fsdp2/core/models/mlp_module.h
//
// The residual MLP (mlp.h) as a strategy::TrainingModule: mean-squared
// error against floating-point targets, cross-entropy against class
// indices, its output for prediction, and the optimizer its options
// describe.
#ifndef FSDP2_CORE_MODELS_MLP_MODULE_H_
#define FSDP2_CORE_MODELS_MLP_MODULE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <optional>

#include "core/models/mlp.h"
#include "core/strategy/optimizer.h"
#include "core/strategy/training_module.h"

namespace fsdp2 {
namespace models {

class MLPModule : public strategy::TrainingModule {
 public:
  // Builds the MLP from the default generator and converts its parameters
  // to `dtype` when one is given (see GPTModule).
  explicit MLPModule(const MLPConfig& config,
                     const strategy::OptimizerOptions& optimizer = {},
                     std::optional<at::ScalarType> dtype = std::nullopt);

  std::shared_ptr<torch::nn::Module> module() override { return mlp_.ptr(); }
  // batch = {x [B, in_features], y}: mean-squared error when y is
  // floating-point of the output's shape [B, out_features], cross-entropy
  // when y holds integer class indices [B]. Other targets throw
  // std::invalid_argument saying the shape expected.
  at::Tensor training_step(const strategy::Batch& batch, int64_t batch_idx) override;
  at::Tensor validation_step(const strategy::Batch& batch, int64_t batch_idx) override;
  // batch = {x [B, in_features]}: the output [B, out_features].
  at::Tensor predict_step(const strategy::Batch& batch, int64_t batch_idx) override;
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() override;

  // What training_step and validation_step return.
  at::Tensor loss(const strategy::Batch& batch);

  const MLPConfig& config() const { return config_; }
  MLP mlp() const { return mlp_; }

 private:
  MLPConfig config_;
  MLP mlp_;
  strategy::OptimizerOptions optimizer_;
};

}  // namespace models
}  // namespace fsdp2

#endif  // FSDP2_CORE_MODELS_MLP_MODULE_H_
