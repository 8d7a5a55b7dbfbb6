#include "core/models/llama_module.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/fsdp/fully_shard.h"
#include "core/models/gpt.h"

namespace fsdp2 {
namespace models {

LlamaModule::LlamaModule(const HfLlamaConfig& config, const strategy::OptimizerOptions& optimizer,
                         std::optional<at::ScalarType> dtype, std::string weights_path)
    : model_(config), optimizer_(optimizer), weights_path_(std::move(weights_path)) {
  if (dtype) model_->to(*dtype);
}

std::shared_ptr<LlamaModule> LlamaModule::FromPretrained(
    const std::string& dir, const strategy::OptimizerOptions& optimizer,
    std::optional<at::ScalarType> dtype) {
  return std::make_shared<LlamaModule>(LoadHfConfig(dir), optimizer, dtype, dir);
}

at::Tensor LlamaModule::training_step(const strategy::Batch& batch, int64_t) {
  return loss(batch);
}

at::Tensor LlamaModule::validation_step(const strategy::Batch& batch, int64_t) {
  return loss(batch);
}

at::Tensor LlamaModule::predict_step(const strategy::Batch& batch, int64_t) {
  if (batch.empty()) throw InvalidArgumentError("LlamaModule: predict_step needs {tokens}");
  return logits(batch[0]).argmax(-1);
}

std::unique_ptr<torch::optim::Optimizer> LlamaModule::configure_optimizers() {
  std::vector<at::Tensor> trained;
  for (const at::Tensor& p : model_->parameters()) {
    if (p.requires_grad()) trained.push_back(p);
  }
  if (trained.empty()) {
    throw InvalidArgumentError(
        "LlamaModule: every parameter is frozen (frozen_params): nothing to train");
  }
  return strategy::MakeOptimizer(trained, optimizer_);
}

std::string LlamaModule::hf_config_json(at::ScalarType dtype) const {
  return ToConfigJson(model_->config(), dtype);
}

at::Tensor LlamaModule::loss(const strategy::Batch& batch) {
  if (batch.size() < 2) {
    throw InvalidArgumentError("LlamaModule: a batch is {tokens, targets}, got " +
                               std::to_string(batch.size()) + " tensor(s)");
  }
  // transformers' causal-LM loss upcasts the logits to float32.
  const at::Tensor l = logits(batch[0]);
  return LanguageModelLoss(l.to(at::promote_types(l.scalar_type(), at::kFloat)),
                           batch[1].to(at::kLong));
}

at::Tensor LlamaModule::logits(const at::Tensor& tokens) {
  const at::Tensor t = tokens.to(at::kLong);
  if (t.dim() != 2) {
    throw InvalidArgumentError("LlamaModule: tokens must be [batch, sequence], got " +
                               std::to_string(t.dim()) + " dimension(s)");
  }
  const int64_t vocab = model_->config().vocab_size;
  // Checked on the CPU only (on a GPU it would synchronise every step).
  if (t.is_cpu() && t.numel() > 0 && (t.min().item<int64_t>() < 0 || t.max().item<int64_t>() >= vocab)) {
    throw InvalidArgumentError("LlamaModule: a token id is outside [0, " +
                               std::to_string(vocab) + ") (vocab_size)");
  }
  return fsdp::forward(model_, t);
}

}  // namespace models
}  // namespace fsdp2
