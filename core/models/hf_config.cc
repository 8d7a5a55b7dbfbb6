#include "core/models/hf_config.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace fsdp2 {
namespace models {
namespace {

using nlohmann::json;

// Reads fields of one JSON object; every error names `where` and the field.
class Fields {
 public:
  Fields(const json& object, std::string where) : j_(object), where_(std::move(where)) {}

  [[noreturn]] void Fail(const std::string& field, const std::string& why) const {
    throw InvalidArgumentError(where_ + ": \"" + field + "\" " + why);
  }
  // Present and not null; present.
  bool has(const std::string& field) const { return contains(field) && !j_.at(field).is_null(); }
  bool contains(const std::string& field) const { return j_.contains(field); }
  const json& at(const std::string& field) const { return j_.at(field); }

  int64_t Size(const std::string& field) const {
    if (!has(field)) Fail(field, "is missing (a Llama-family config.json has it)");
    return SizeOf(at(field), field);
  }
  int64_t SizeOr(const std::string& field, int64_t fallback) const {
    return has(field) ? SizeOf(at(field), field) : fallback;
  }
  double NumberOr(const std::string& field, double fallback) const {
    if (!has(field)) return fallback;
    if (!at(field).is_number()) Fail(field, "must be a number, got " + at(field).dump());
    return at(field).get<double>();
  }
  // `v` (the field's value, or one element of it) as an integer >= 0.
  int64_t NonNegativeInteger(const json& v, const std::string& field) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      Fail(field, "must be a non-negative integer, got " + v.dump());
    }
    return v.get<int64_t>();
  }
  bool BoolOr(const std::string& field, bool fallback) const {
    if (!has(field)) return fallback;
    if (!at(field).is_boolean()) Fail(field, "must be true or false, got " + at(field).dump());
    return at(field).get<bool>();
  }
  std::string StringOr(const std::string& field, const std::string& fallback) const {
    if (!has(field)) return fallback;
    if (!at(field).is_string()) Fail(field, "must be a string, got " + at(field).dump());
    return at(field).get<std::string>();
  }

 private:
  int64_t SizeOf(const json& v, const std::string& field) const {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
      Fail(field, "must be a positive integer, got " + v.dump());
    }
    return v.get<int64_t>();
  }

  const json& j_;
  std::string where_;
};

c10::optional<at::ScalarType> FloatDtypeOrNone(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float64") return at::kDouble;
  return c10::nullopt;
}

at::ScalarType DtypeOf(const Fields& f, const std::string& field) {
  const std::string name = f.StringOr(field, "");
  const c10::optional<at::ScalarType> dtype = FloatDtypeOrNone(name);
  if (!dtype) f.Fail(field, "is \"" + name + "\"; supported: float32, bfloat16, float16, float64");
  return *dtype;
}

// The rotary settings: rope_parameters (transformers 5) or rope_scaling (4),
// and rope_theta from that dict or the top level.
void ReadRope(const Fields& top, const std::string& where, HfLlamaConfig& c) {
  const char* dict_name = top.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  json dict = top.has(dict_name) ? top.at(dict_name) : json::object();
  if (!dict.is_object()) top.Fail(dict_name, "must be an object, got " + dict.dump());
  const Fields rope(dict, where + " " + dict_name);
  c.rope_theta = rope.NumberOr("rope_theta", top.NumberOr("rope_theta", 10000.0));
  if (!(c.rope_theta > 0)) top.Fail("rope_theta", "must be positive");
  const std::string type = rope.StringOr("rope_type", rope.StringOr("type", "default"));
  for (const Fields* f : {&top, &rope}) {
    if (f->NumberOr("partial_rotary_factor", 1.0) != 1.0) {
      f->Fail("partial_rotary_factor", "is not supported (rotary embedding on part of each head)");
    }
  }
  if (type == "default") return;
  if (type != "linear" && type != "llama3") {
    rope.Fail("rope_type", "is \"" + type + "\"; supported: default, linear, llama3");
  }
  if (!rope.has("factor")) rope.Fail("factor", "is missing (rope_type " + type + ")");
  c.rope.factor = rope.NumberOr("factor", 1.0);
  if (!(c.rope.factor > 0)) rope.Fail("factor", "must be positive");
  if (type == "linear") {
    c.rope.type = RopeType::kLinear;
    return;
  }
  c.rope.type = RopeType::kLlama3;
  for (const char* key : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    if (!rope.has(key)) rope.Fail(key, "is missing (rope_type llama3)");
  }
  c.rope.low_freq_factor = rope.NumberOr("low_freq_factor", 1.0);
  c.rope.high_freq_factor = rope.NumberOr("high_freq_factor", 4.0);
  c.rope.original_max_position_embeddings = rope.Size("original_max_position_embeddings");
  if (!(c.rope.high_freq_factor > c.rope.low_freq_factor)) {
    rope.Fail("high_freq_factor", "must be above low_freq_factor");
  }
}

// Sliding windows per layer: Mistral's one window for every layer (4096
// when the key is absent, none when null); Qwen2's only with
// use_sliding_window, on the layers layer_types names (default: from
// max_window_layers on).
void ReadSlidingWindow(const Fields& f, HfLlamaConfig& c) {
  c.sliding_window.assign(static_cast<size_t>(c.num_hidden_layers), 0);
  if (c.model_type == "llama") return;
  // An absent key takes transformers' default (4096); null means none.
  int64_t w = 4096;
  if (f.contains("sliding_window")) w = f.has("sliding_window") ? f.Size("sliding_window") : 0;
  if (w == 0) return;
  if (c.model_type == "mistral") {
    c.sliding_window.assign(c.sliding_window.size(), w);
    return;
  }
  if (!f.BoolOr("use_sliding_window", false)) return;
  if (f.has("layer_types")) {
    const json& types = f.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
      f.Fail("layer_types", "must list one type per layer (" +
                                std::to_string(c.num_hidden_layers) + "), got " + types.dump());
    }
    for (size_t i = 0; i < types.size(); ++i) {
      const std::string t = types[i].is_string() ? types[i].get<std::string>() : types[i].dump();
      if (t != "full_attention" && t != "sliding_attention") {
        f.Fail("layer_types", "has \"" + t + "\"; supported: full_attention, sliding_attention");
      }
      c.sliding_window[i] = t == "sliding_attention" ? w : 0;
    }
    return;
  }
  const int64_t first = f.SizeOr("max_window_layers", 28);
  for (int64_t i = first; i < c.num_hidden_layers; ++i) c.sliding_window[i] = w;
}

}  // namespace

at::ScalarType FloatDtypeOfName(const std::string& name) {
  const c10::optional<at::ScalarType> dtype = FloatDtypeOrNone(name);
  if (!dtype) {
    throw InvalidArgumentError("dtype \"" + name +
                               "\": known are \"float32\", \"bfloat16\", \"float16\", \"float64\"");
  }
  return *dtype;
}

HfLlamaConfig ParseHfConfig(const std::string& json_text, const std::string& where) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw InvalidArgumentError(where + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw InvalidArgumentError(where + " must hold a JSON object");
  const Fields f(j, where);
  HfLlamaConfig c;
  c.json = json_text;
  c.model_type = f.StringOr("model_type", "");
  static const std::set<std::string> kFamilies = {"llama", "mistral", "qwen2"};
  if (c.model_type.empty()) f.Fail("model_type", "is missing (a Llama-family config.json has it)");
  if (!kFamilies.count(c.model_type)) {
    f.Fail("model_type", "is \"" + c.model_type + "\"; supported: llama, mistral, qwen2");
  }
  if (f.has("architectures")) {
    static const std::set<std::string> kArchitectures = {
        "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};
    for (const json& a : f.at("architectures")) {
      if (!a.is_string() || !kArchitectures.count(a.get<std::string>())) {
        f.Fail("architectures", "has " + a.dump() + "; supported: LlamaForCausalLM, "
                                                    "MistralForCausalLM, Qwen2ForCausalLM");
      }
    }
  }
  if (f.has("quantization_config")) f.Fail("quantization_config", "is not supported (quantized weights)");
  c.vocab_size = f.Size("vocab_size");
  c.hidden_size = f.Size("hidden_size");
  c.intermediate_size = f.Size("intermediate_size");
  c.num_hidden_layers = f.Size("num_hidden_layers");
  c.num_attention_heads = f.Size("num_attention_heads");
  const int64_t kv_default = c.model_type == "llama"     ? c.num_attention_heads
                             : c.model_type == "mistral" ? 8
                                                         : 32;
  c.num_key_value_heads = f.SizeOr("num_key_value_heads", kv_default);
  // Integer fields that transformers reads but this model does not need
  // are still checked: an integer in range, or the file is refused.
  c.max_position_embeddings = f.SizeOr("max_position_embeddings", 0);
  f.SizeOr("pretraining_tp", 1);
  if (f.has("max_window_layers")) f.NonNegativeInteger(f.at("max_window_layers"), "max_window_layers");
  for (const char* field : {"bos_token_id", "eos_token_id"}) {
    if (!f.has(field)) continue;
    const json& ids = f.at(field);  // eos_token_id may list several
    if (ids.is_array()) {
      for (const json& id : ids) f.NonNegativeInteger(id, field);
    } else {
      f.NonNegativeInteger(ids, field);
    }
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    f.Fail("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) +
                                      ") must divide num_attention_heads (" +
                                      std::to_string(c.num_attention_heads) + ")");
  }
  if (f.has("head_dim")) {
    c.head_dim = f.Size("head_dim");
  } else if (c.hidden_size % c.num_attention_heads != 0) {
    f.Fail("head_dim", "is missing and num_attention_heads does not divide hidden_size");
  } else {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) f.Fail("head_dim", "must be even (rotary halves), got " + std::to_string(c.head_dim));
  const std::string act = f.StringOr("hidden_act", "silu");
  if (act != "silu" && act != "swish") f.Fail("hidden_act", "is \"" + act + "\"; supported: silu");
  if (f.NumberOr("attention_dropout", 0.0) != 0.0) f.Fail("attention_dropout", "must be 0");
  c.rms_norm_eps = f.NumberOr("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0)) f.Fail("rms_norm_eps", "must be positive");
  ReadRope(f, where, c);
  if (c.model_type == "llama") {
    c.qkv_bias = c.o_bias = f.BoolOr("attention_bias", false);
    c.mlp_bias = f.BoolOr("mlp_bias", false);
  } else if (c.model_type == "qwen2") {
    c.qkv_bias = true;
  }
  c.tie_word_embeddings = f.BoolOr("tie_word_embeddings", false);
  ReadSlidingWindow(f, c);
  if (f.has("pad_token_id")) {
    if (!f.at("pad_token_id").is_number_integer() || f.at("pad_token_id").get<int64_t>() < 0 ||
        f.at("pad_token_id").get<int64_t>() >= c.vocab_size) {
      f.Fail("pad_token_id", "must be a token id below vocab_size, got " + f.at("pad_token_id").dump());
    }
    c.pad_token_id = f.at("pad_token_id").get<int64_t>();
  }
  if (f.has("dtype")) {
    c.dtype = DtypeOf(f, "dtype");
  } else if (f.has("torch_dtype")) {
    c.dtype = DtypeOf(f, "torch_dtype");
  }
  return c;
}

HfLlamaConfig LoadHfConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) throw NotFoundError("Hugging Face checkpoint " + dir + " has no config.json");
  std::stringstream text;
  text << in.rdbuf();
  return ParseHfConfig(text.str(), path);
}

std::string ToConfigJson(const HfLlamaConfig& c, at::ScalarType dtype) {
  const std::string type = dtype == at::kBFloat16 ? "bfloat16"
                           : dtype == at::kHalf   ? "float16"
                           : dtype == at::kDouble ? "float64"
                                                  : "float32";
  const std::string architecture = c.model_type == "mistral" ? "MistralForCausalLM"
                                   : c.model_type == "qwen2" ? "Qwen2ForCausalLM"
                                                             : "LlamaForCausalLM";
  json j;
  if (!c.json.empty()) {
    j = json::parse(c.json);
  } else {
    j = {{"model_type", c.model_type},
         {"vocab_size", c.vocab_size},
         {"hidden_size", c.hidden_size},
         {"intermediate_size", c.intermediate_size},
         {"num_hidden_layers", c.num_hidden_layers},
         {"num_attention_heads", c.num_attention_heads},
         {"num_key_value_heads", c.num_key_value_heads},
         {"head_dim", c.head_dim},
         {"hidden_act", "silu"},
         {"rms_norm_eps", c.rms_norm_eps},
         {"tie_word_embeddings", c.tie_word_embeddings}};
    json rope = {{"rope_theta", c.rope_theta}, {"rope_type", "default"}};
    if (c.rope.type == RopeType::kLinear) {
      rope["rope_type"] = "linear";
      rope["factor"] = c.rope.factor;
    } else if (c.rope.type == RopeType::kLlama3) {
      rope = {{"rope_theta", c.rope_theta},
              {"rope_type", "llama3"},
              {"factor", c.rope.factor},
              {"low_freq_factor", c.rope.low_freq_factor},
              {"high_freq_factor", c.rope.high_freq_factor},
              {"original_max_position_embeddings", c.rope.original_max_position_embeddings}};
    }
    j["rope_parameters"] = rope;
    if (c.model_type == "llama") {
      j["attention_bias"] = c.qkv_bias;
      j["mlp_bias"] = c.mlp_bias;
    }
    if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
    if (c.max_position_embeddings > 0) j["max_position_embeddings"] = c.max_position_embeddings;
    const int64_t window = c.sliding_window.empty() ? 0 : c.sliding_window.back();
    if (c.model_type == "mistral") j["sliding_window"] = window > 0 ? json(window) : json(nullptr);
    if (c.model_type == "qwen2") {
      json types = json::array();
      for (int64_t w : c.sliding_window) types.push_back(w > 0 ? "sliding_attention" : "full_attention");
      j["use_sliding_window"] = window > 0;
      j["sliding_window"] = window > 0 ? json(window) : json(nullptr);
      if (window > 0) j["layer_types"] = types;
    }
  }
  if (j.contains("torch_dtype")) j["torch_dtype"] = type;
  j["dtype"] = type;
  if (!j.contains("architectures")) j["architectures"] = json::array({architecture});
  return j.dump(2) + "\n";
}

at::Tensor RopeInvFreq(const HfLlamaConfig& c) {
  at::NoGradGuard no_grad;
  const int64_t dim = c.head_dim;
  // transformers: 1 / theta ** (arange(0, dim, 2).float() / dim), in float32
  // (`1.0 / t` is t.reciprocal() * 1.0 there, `s / t` t.reciprocal() * s).
  const at::Tensor exponent = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / dim;
  at::Tensor inv_freq = at::reciprocal(at::pow(c.rope_theta, exponent));
  if (c.rope.type == RopeType::kLinear) return inv_freq / c.rope.factor;
  if (c.rope.type != RopeType::kLlama3) return inv_freq;
  // Llama 3: long wavelengths slowed by `factor`, short ones kept, the band
  // between blended smoothly (transformers' _compute_llama3_parameters).
  const RopeScaling& r = c.rope;
  const double old_context = static_cast<double>(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / r.low_freq_factor;
  const double high_freq_wavelen = old_context / r.high_freq_factor;
  const at::Tensor wavelen = at::reciprocal(inv_freq) * (2 * M_PI);
  const at::Tensor scaled =
      at::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  const at::Tensor smooth =
      (at::reciprocal(wavelen) * old_context - r.low_freq_factor) /
      (r.high_freq_factor - r.low_freq_factor);
  const at::Tensor smoothed = at::rsub(smooth, 1) * scaled / r.factor + smooth * scaled;
  const at::Tensor medium =
      at::logical_not(wavelen < high_freq_wavelen) * at::logical_not(wavelen > low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

}  // namespace models
}  // namespace fsdp2
