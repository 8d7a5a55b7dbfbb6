// fsdp2/core/models/llama.h
//
// The Llama family's decoder (Hugging Face transformers' LlamaForCausalLM,
// MistralForCausalLM and Qwen2ForCausalLM) built from a config.json
// (hf_config.h): token embedding, num_hidden_layers pre-RMSNorm decoder
// layers (grouped-query attention with rotary embeddings, a SwiGLU MLP, each
// with a residual), a final RMSNorm and an LM head, untied or tied to the
// embedding. Modules and parameters carry exactly the checkpoint's names
// (model.layers.3.self_attn.q_proj.weight), registered in transformers'
// order, so a checkpoint loads by name and saves back unchanged.
//
// The math follows transformers' eager implementation op for op where it
// decides float32 equality: RMSNorm in float32 with the weight applied after
// the cast back, rotary frequencies in float32 (hf_config.h's RopeInvFreq),
// scores multiplied by head_dim^-0.5, softmax in float32. Mistral's and
// Qwen2's sliding windows are applied per layer.
//
// Each decoder layer is called through fsdp::forward, so it can be its own
// FSDP unit (FSDP2Strategy's default wrapping makes every layer one) and be
// activation-checkpointed; the projections through tp::forward, so they can
// be tensor-parallel (tensor_parallel_plan()).
#ifndef FSDP2_CORE_MODELS_LLAMA_H_
#define FSDP2_CORE_MODELS_LLAMA_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <utility>
#include <vector>

#include "core/models/hf_config.h"
#include "core/tp/plan.h"

namespace fsdp2 {
namespace models {

// x * rsqrt(mean(x^2) + eps) computed in float32 (float64 inputs in
// float64), cast back to x's dtype,
// then multiplied by `weight` (ones at construction).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t size, double eps);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Which keys each query may see beyond causality: for packed rows (several
// documents in one sequence) and padded rows, `allowed` [B, 1, T, T] (bool)
// is true where query q and key k belong to the same document; undefined for
// rows that are one document each. A plain struct rather than a tensor
// argument: it takes no gradient and is not cast under mixed precision.
struct AttentionMask {
  at::Tensor allowed;
};

// Low-rank adapters (LoRA, as PEFT's LoraConfig): the named projections of
// every decoder layer get y = W x + (alpha / rank) * B A dropout(x), with
// A [rank, in] drawn as PEFT draws it (Kaiming uniform, a = sqrt(5)) and B
// [out, rank] zero, registered as the projection's children lora_A and
// lora_B (model.layers.0.self_attn.q_proj.lora_A.weight: PEFT's names
// without its "base_model.model." prefix). Every other parameter is frozen.
struct LoraOptions {
  int64_t rank = 0;     // 0: no adapters
  double alpha = 8;     // PEFT's default lora_alpha
  double dropout = 0;   // on the adapter's input, in training only
  // Of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  double scaling() const { return alpha / static_cast<double>(rank); }
};

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  // The attention of decoder layer `layer` (its sliding window).
  LlamaAttentionImpl(const HfLlamaConfig& config, int64_t layer);
  // x [B, T, hidden], cos and sin [T, head_dim] (or [B, 1, T, head_dim] for
  // per-row positions) in x's dtype. Under tensor parallelism q, k, v give
  // this rank's heads and o_proj sums over ranks.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const AttentionMask& mask = {});

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t head_dim_;
  int64_t window_;  // 0: full causal attention
};
TORCH_MODULE(LlamaAttention);

// down_proj(silu(gate_proj(x)) * up_proj(x)).
class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const HfLlamaConfig& config);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const HfLlamaConfig& config, int64_t layer);
  // h = x + self_attn(input_layernorm(x));
  // h + mlp(post_attention_layernorm(h)).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const AttentionMask& mask = {});

  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

// transformers' LlamaModel: the embedding, the layers and the final norm
// (the rotary embedding has no parameters; LlamaForCausalLM computes it).
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const HfLlamaConfig& config);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module,
                             public tp::TensorParallelPlanProvider {
 public:
  // Parameters drawn as transformers' _init_weights draws them (normal with
  // std 0.02 for projections and the embedding, zero biases, unit norms, a
  // zero padding row); a checkpoint then overwrites them. Throws
  // InvalidArgumentError for a config with a non-positive size.
  explicit LlamaForCausalLMImpl(const HfLlamaConfig& config);
  // tokens [B, T] (int64) -> logits [B, T, vocab_size] in the activations'
  // dtype (transformers does not upcast them either). `segments` [B, T]
  // (integers, optional) packs several documents into a row: equal
  // neighbouring values are one document, whose positions restart at 0 and
  // whose tokens attend only inside it (padding is a document of its own,
  // -1 by convention); undefined: each row is one document.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& segments = at::Tensor());
  // The final hidden states [B, T, hidden] (forward without the LM head).
  at::Tensor hidden(const at::Tensor& tokens, const at::Tensor& segments = at::Tensor());

  // Adds LoRA adapters (LoraOptions) to the decoder layers and freezes
  // every other parameter. Call once, before the model is sharded or
  // converted to another dtype (LlamaModule's constructor does).
  // InvalidArgumentError for a rank below 1, an alpha that is not positive,
  // a dropout outside [0, 1), a target that names no projection, or a
  // second call.
  void add_lora(const LoraOptions& lora);
  // The adapters' options (rank 0 when there are none).
  const LoraOptions& lora() const { return lora_; }

  const HfLlamaConfig& config() const { return config_; }
  LlamaDecoderLayer layer(size_t i) const;
  // q, k, v, gate and up column-wise; o and down row-wise; embedding, norms
  // and the LM head replicated (transformers' own base_model_tp_plan).
  // Throws InvalidArgumentError unless tp_size divides the attention heads,
  // the key/value heads and intermediate_size.
  tp::TensorParallelPlan tensor_parallel_plan(int tp_size) const override;

  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  HfLlamaConfig config_;
  LoraOptions lora_;
};
TORCH_MODULE(LlamaForCausalLM);

// Per-row position ids [B, T] of `segments` [B, T]: 0 at the first token of
// each run of equal values, counting up within it.
at::Tensor SegmentPositions(const at::Tensor& segments);
// [B, 1, T, T] true where query q and key k lie in the same segment (the
// causal and window limits are the attention's own).
AttentionMask SegmentMask(const at::Tensor& segments);

// The projections LoRA may target: q_proj, k_proj, v_proj, o_proj,
// gate_proj, up_proj, down_proj.
const std::vector<std::string>& LoraTargetNames();
// Throws InvalidArgumentError naming what is wrong unless `lora` is valid
// adapters: rank >= 1, alpha > 0, dropout in [0, 1), targets known and
// not none (what add_lora checks, for front ends to check early).
void CheckLora(const LoraOptions& lora);

// The rotary tables of positions 0..T-1 for `config`: {cos, sin}, each
// [T, head_dim] in `dtype` on `device`, computed in float32 (float64 for
// a float64 `dtype`) as transformers computes them.
std::pair<at::Tensor, at::Tensor> RotaryTables(const HfLlamaConfig& config, int64_t T,
                                               at::ScalarType dtype, c10::Device device);

// The names and shapes transformers gives this config's parameters, in its
// state_dict order (what a checkpoint of it holds).
std::vector<std::pair<std::string, std::vector<int64_t>>> LlamaParameterShapes(
    const HfLlamaConfig& config);

}  // namespace models
}  // namespace fsdp2

#endif  // FSDP2_CORE_MODELS_LLAMA_H_
