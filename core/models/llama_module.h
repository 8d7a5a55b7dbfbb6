// fsdp2/core/models/llama_module.h
//
// A Hugging Face Llama-family checkpoint (llama.h) as a TrainingModule for
// FSDP2Strategy, and an HfModel: parallelize() loads the checkpoint's
// weights row by row into the sharded model, save_hf_checkpoint() writes
// them back with config.json. Next-token cross-entropy for training and
// validation (logits upcast to float32, as transformers' loss does), the
// most likely next token for prediction, and the optimizer over the
// parameters that train (frozen ones get no optimizer state).
//
//   FSDP2Strategy strategy(options);       // options.frozen_params = {...}
//   strategy.setup_environment();
//   std::shared_ptr<LlamaModule> m;
//   {
//     auto init = strategy.tensor_init_context();
//     m = LlamaModule::FromPretrained("/models/llama", models::GPT2AdamW(1e-5));
//   }
//   strategy.connect(m);
//   strategy.parallelize();                  // shards, then loads the rows
#ifndef FSDP2_CORE_MODELS_LLAMA_MODULE_H_
#define FSDP2_CORE_MODELS_LLAMA_MODULE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <optional>
#include <string>

#include "core/models/hf_config.h"
#include "core/models/llama.h"
#include "core/strategy/hf_model.h"
#include "core/strategy/optimizer.h"
#include "core/strategy/training_module.h"

namespace fsdp2 {
namespace models {

class LlamaModule : public strategy::TrainingModule, public strategy::HfModel {
 public:
  // The model of `config`, initialised as transformers initialises it, in
  // float32 or `dtype` (Module::to, so deferred under tensor_init_context();
  // the config's dtype is how the files store the weights, not what trains),
  // whose weights parallelize() loads from `weights_path` ("" for none).
  // With `lora.rank` > 0 the model gets LoRA adapters and only they train
  // (LlamaForCausalLMImpl::add_lora; its errors).
  LlamaModule(const HfLlamaConfig& config, const strategy::OptimizerOptions& optimizer = {},
              std::optional<at::ScalarType> dtype = std::nullopt,
              std::string weights_path = "", const LoraOptions& lora = {});
  // The checkpoint directory `dir`: its config.json now, its weights in
  // parallelize(). Parameters are float32 unless `dtype` says otherwise,
  // whatever the files hold (they are converted as they load).
  static std::shared_ptr<LlamaModule> FromPretrained(
      const std::string& dir, const strategy::OptimizerOptions& optimizer = {},
      std::optional<at::ScalarType> dtype = std::nullopt, const LoraOptions& lora = {});

  std::shared_ptr<torch::nn::Module> module() override { return model_.ptr(); }
  // batch = {tokens [B, T], targets [B, T]} or {tokens, targets, segments
  // [B, T]}: the mean next-token cross-entropy over the targets that are
  // not the ignore index -100 (0 when there are none). Segments pack
  // several documents into a row (LlamaForCausalLMImpl::forward); padding
  // is a segment of its own whose targets are -100.
  at::Tensor training_step(const strategy::Batch& batch, int64_t batch_idx) override;
  at::Tensor validation_step(const strategy::Batch& batch, int64_t batch_idx) override;
  // batch = {tokens [B, T]}: the most likely next token, [B, T] int64.
  at::Tensor predict_step(const strategy::Batch& batch, int64_t batch_idx) override;
  // Over the parameters that require a gradient.
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() override;

  // The targets of `batch` other than -100 (TrainingModule::loss_items):
  // the step's loss is the mean over those of the whole global batch.
  int64_t loss_items(const strategy::Batch& batch) override;

  std::string hf_weights_path() const override { return weights_path_; }
  std::string hf_config_json(at::ScalarType dtype) const override;
  strategy::HfLora hf_lora() const override;

  at::Tensor loss(const strategy::Batch& batch);
  // Logits [B, T, vocab_size] through fsdp::forward (`segments` as in
  // loss()).
  at::Tensor logits(const at::Tensor& tokens, const at::Tensor& segments = at::Tensor());

  LlamaForCausalLM model() const { return model_; }
  const HfLlamaConfig& config() const { return model_->config(); }

 private:
  LlamaForCausalLM model_;
  strategy::OptimizerOptions optimizer_;
  std::string weights_path_;
};

}  // namespace models
}  // namespace fsdp2

#endif  // FSDP2_CORE_MODELS_LLAMA_MODULE_H_
