// fsdp2/core/models/hf_config.h
//
// A Hugging Face config.json of the Llama family (model_type "llama",
// "mistral", "qwen2"), read into what a Llama-family decoder needs: sizes,
// grouped-query attention, rotary embeddings (default, linear and Llama 3
// frequency scaling), biases, tied embeddings and sliding windows per layer.
// Both config forms are read: transformers 4's (top-level rope_theta and
// rope_scaling, torch_dtype) and 5's (rope_parameters, dtype). Anything the
// model cannot represent is an InvalidArgumentError that names the field
// and the file, never a silent approximation. Issue #27; the plan is
// docs/design/hf-llama-plan.md.
#ifndef FSDP2_CORE_MODELS_HF_CONFIG_H_
#define FSDP2_CORE_MODELS_HF_CONFIG_H_

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp2 {
namespace models {

// How rotary frequencies are scaled (rope_type).
enum class RopeType { kDefault, kLinear, kLlama3 };

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;            // linear and llama3
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

struct HfLlamaConfig {
  std::string model_type;  // llama | mistral | qwen2
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // config's, else hidden_size / num_attention_heads
  // The context the checkpoint was trained for (0: not given). Rotary
  // embeddings do not limit the sequence length; kept for saving.
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope;
  bool qkv_bias = false;   // q_proj, k_proj, v_proj
  bool o_bias = false;     // o_proj
  bool mlp_bias = false;   // gate_proj, up_proj, down_proj
  bool tie_word_embeddings = false;
  // One entry per layer: the attention window (a token attends to itself
  // and the window - 1 before it), 0 for full causal attention.
  std::vector<int64_t> sliding_window;
  c10::optional<int64_t> pad_token_id;  // its embedding row gets no gradient
  c10::optional<at::ScalarType> dtype;  // torch_dtype / dtype, where given
  std::string json;  // the file's text, for saving it back
};

// Parses config.json's text; `where` names it in errors (a path).
// Throws InvalidArgumentError naming the field for a missing required size
// (model_type, vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads), a model_type other than llama,
// mistral or qwen2, hidden_act other than silu, a rope type other than
// default, linear or llama3 (or llama3 without its four keys), a partial
// rotary factor, attention dropout, quantization, heads that the key/value
// heads do not divide, an odd head_dim, a non-positive size or a bad
// layer_types. Integer fields are integers in range wherever they are
// given, also those the model does not use (max_position_embeddings and
// pretraining_tp positive; bos_token_id, eos_token_id -- or a list of them
// -- and max_window_layers non-negative): 1e-300, 4096.5 or "4096" is
// refused naming the field.
HfLlamaConfig ParseHfConfig(const std::string& json_text, const std::string& where);

// DIR/config.json parsed; NotFoundError if it does not exist.
HfLlamaConfig LoadHfConfig(const std::string& dir);

// config.json's text for weights saved in `dtype`: the file this config
// was read from with its dtype (and torch_dtype, where present) set and
// architectures filled in where absent, or, for a config made in code,
// transformers 5's form of its fields.
std::string ToConfigJson(const HfLlamaConfig& config, at::ScalarType dtype);

// "float32", "bfloat16", "float16" or "float64" (as JSON configurations
// name a floating-point dtype); InvalidArgumentError naming the four
// otherwise.
at::ScalarType FloatDtypeOfName(const std::string& name);

// The rotary inverse frequencies, float32 [head_dim / 2], as transformers
// computes them (in float32, with the config's scaling applied).
at::Tensor RopeInvFreq(const HfLlamaConfig& config);

}  // namespace models
}  // namespace fsdp2

#endif  // FSDP2_CORE_MODELS_HF_CONFIG_H_
