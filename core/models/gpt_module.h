// fsdp2/core/models/gpt_module.h
//
// The GPT (gpt.h) as a strategy::TrainingModule, ready to hand to
// FSDP2Strategy: next-token cross-entropy for training and validation, the
// most likely next token for prediction, and the optimizer its options
// describe. The main job (examples/train_gpt.cc), the benchmarks and the
// tests all train this one module.
#ifndef FSDP2_CORE_MODELS_GPT_MODULE_H_
#define FSDP2_CORE_MODELS_GPT_MODULE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <optional>

#include "core/models/gpt.h"
#include "core/strategy/optimizer.h"
#include "core/strategy/training_module.h"

namespace fsdp2 {
namespace models {

// AdamW with GPT-2's hyper-parameters, betas (0.9, 0.95) and weight decay
// 0.1, at learning rate `lr`: what the main job and the benchmarks use.
strategy::OptimizerOptions GPT2AdamW(double lr);

class GPTModule : public strategy::TrainingModule {
 public:
  // Builds the GPT, drawing its initial parameters from the default
  // generator (seed it first, or let FSDP2Strategy::setup_environment do
  // it), and converts them to `dtype` when one is given (Module::to, so a
  // conversion under tensor_init_context() is deferred too). Throws
  // std::invalid_argument for an invalid config.
  explicit GPTModule(const GPTConfig& config,
                     const strategy::OptimizerOptions& optimizer = {},
                     std::optional<at::ScalarType> dtype = std::nullopt);

  std::shared_ptr<torch::nn::Module> module() override { return gpt_.ptr(); }
  // batch = {tokens [B, T], targets [B, T]} of any integer type: the mean
  // next-token cross-entropy (loss()).
  at::Tensor training_step(const strategy::Batch& batch, int64_t batch_idx) override;
  at::Tensor validation_step(const strategy::Batch& batch, int64_t batch_idx) override;
  // batch = {tokens [B, T]}: the most likely next token at every position,
  // [B, T] int64.
  at::Tensor predict_step(const strategy::Batch& batch, int64_t batch_idx) override;
  // The optimizer the constructor's options describe, over module()'s
  // parameters (local shards after parallelize()).
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() override;

  // What training_step and validation_step return, through fsdp::forward:
  // on a GPU GPT's fused head and loss (GPTImpl::forward(tokens, targets)),
  // elsewhere LanguageModelLoss(logits(tokens), targets).
  at::Tensor loss(const strategy::Batch& batch);
  // Logits [B, T, vocab_size] of tokens [B, T], through fsdp::forward.
  at::Tensor logits(const at::Tensor& tokens);

  // The model (a handle sharing this module's GPT).
  GPT gpt() const { return gpt_; }
  const strategy::OptimizerOptions& optimizer_options() const { return optimizer_; }

 private:
  GPT gpt_;
  strategy::OptimizerOptions optimizer_;
};

}  // namespace models
}  // namespace fsdp2

#endif  // FSDP2_CORE_MODELS_GPT_MODULE_H_
