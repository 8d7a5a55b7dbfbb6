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
namespace {
// Targets that add nothing to the loss (PyTorch's and transformers' value).
constexpr int64_t kIgnoreIndex = -100;
}  // namespace

LlamaModule::LlamaModule(const HfLlamaConfig& config, const strategy::OptimizerOptions& optimizer,
                         std::optional<at::ScalarType> dtype, std::string weights_path,
                         const LoraOptions& lora)
    : model_(config), optimizer_(optimizer), weights_path_(std::move(weights_path)) {
  if (lora.rank > 0) model_->add_lora(lora);
  if (dtype) model_->to(*dtype);
}

std::shared_ptr<LlamaModule> LlamaModule::FromPretrained(
    const std::string& dir, const strategy::OptimizerOptions& optimizer,
    std::optional<at::ScalarType> dtype, const LoraOptions& lora) {
  return std::make_shared<LlamaModule>(LoadHfConfig(dir), optimizer, dtype, dir, lora);
}

int64_t LlamaModule::loss_items(const strategy::Batch& batch) {
  if (batch.size() < 2) return -1;
  return batch[1].ne(kIgnoreIndex).sum().item<int64_t>();
}

strategy::HfLora LlamaModule::hf_lora() const {
  const LoraOptions& l = model_->lora();
  strategy::HfLora out;
  if (l.rank < 1) return out;
  out.rank = l.rank;
  out.alpha = l.alpha;
  out.dropout = l.dropout;
  out.target_modules = l.target_modules;
  return out;
}

at::Tensor LlamaModule::training_step(const strategy::Batch& batch, int64_t) {
  return loss(batch);
}

at::Tensor LlamaModule::validation_step(const strategy::Batch& batch, int64_t) {
  return loss(batch);
}

at::Tensor LlamaModule::predict_step(const strategy::Batch& batch, int64_t) {
  if (batch.empty()) throw InvalidArgumentError("LlamaModule: predict_step needs {tokens}");
  return logits(batch[0], batch.size() > 2 ? batch[2] : at::Tensor()).argmax(-1);
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
  if (batch.size() < 2 || batch.size() > 3) {
    throw InvalidArgumentError(
        "LlamaModule: a batch is {tokens, targets} or {tokens, targets, segments}, got " +
        std::to_string(batch.size()) + " tensor(s)");
  }
  // transformers' causal-LM loss upcasts the logits to float32; its sum
  // over the targets that count, over their number (1 when none do, so an
  // all-masked batch gives 0 and no gradient rather than 0/0).
  const at::Tensor l = logits(batch[0], batch.size() > 2 ? batch[2] : at::Tensor());
  const at::Tensor targets = batch[1].to(l.device()).to(at::kLong).reshape({-1});
  const at::Tensor sum = at::cross_entropy_loss(
      l.to(at::promote_types(l.scalar_type(), at::kFloat)).reshape({-1, l.size(-1)}), targets,
      /*weight=*/{}, at::Reduction::Sum, kIgnoreIndex);
  return sum / targets.ne(kIgnoreIndex).sum().clamp_min(1).to(sum.scalar_type());
}

at::Tensor LlamaModule::logits(const at::Tensor& tokens, const at::Tensor& segments) {
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
  // The model checks the segments' shape.
  return fsdp::forward(model_, t, segments.defined() ? segments.to(at::kLong) : segments);
}

}  // namespace models
}  // namespace fsdp2
