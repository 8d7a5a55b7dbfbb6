#include "core/models/gpt_module.h"
#include "core/common/error.h"

#include <stdexcept>
#include <string>

#include "core/fsdp/fully_shard.h"

namespace fsdp2 {
namespace models {

strategy::OptimizerOptions GPT2AdamW(double lr) {
  strategy::OptimizerOptions o;
  o.kind = strategy::OptimizerKind::kAdamW;
  o.lr = lr;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  return o;
}

GPTModule::GPTModule(const GPTConfig& config, const strategy::OptimizerOptions& optimizer,
                     std::optional<at::ScalarType> dtype)
    : gpt_(config), optimizer_(optimizer) {
  if (dtype) gpt_->to(*dtype);
}

at::Tensor GPTModule::training_step(const strategy::Batch& batch, int64_t) {
  return loss(batch);
}

at::Tensor GPTModule::validation_step(const strategy::Batch& batch, int64_t) {
  return loss(batch);
}

at::Tensor GPTModule::predict_step(const strategy::Batch& batch, int64_t) {
  if (batch.empty()) throw InvalidArgumentError("GPTModule: predict_step needs {tokens}");
  return logits(batch[0]).argmax(-1);
}

std::unique_ptr<torch::optim::Optimizer> GPTModule::configure_optimizers() {
  return strategy::MakeOptimizer(gpt_->parameters(), optimizer_);
}

at::Tensor GPTModule::loss(const strategy::Batch& batch) {
  if (batch.size() < 2) {
    throw InvalidArgumentError("GPTModule: a batch is {tokens, targets}, got " +
                                std::to_string(batch.size()) + " tensor(s)");
  }
  const at::Tensor tokens = batch[0].to(at::kLong), targets = batch[1].to(at::kLong);
  // On a GPU the model's head and loss are fused and chunked (GPT's
  // two-argument forward): no logits for the whole batch. On the CPU,
  // today's ops: the logits, in the root's output dtype, then the loss.
  if (tokens.is_cuda()) return fsdp::forward(gpt_, tokens, targets);
  return LanguageModelLoss(logits(tokens), targets);
}

at::Tensor GPTModule::logits(const at::Tensor& tokens) {
  return fsdp::forward(gpt_, tokens.to(at::kLong));
}

}  // namespace models
}  // namespace fsdp2
