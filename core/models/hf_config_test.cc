// Hugging Face Llama-family config.json: both transformers forms, the three
// families' defaults and biases, sliding windows per layer, every refusal
// naming its field, and the rotary frequencies of each scaling.
#include "core/models/hf_config.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fsdp2 {
namespace models {
namespace {

// Llama 3's published config, shrunk: transformers 4's form.
const char* kLlama3 = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128,
  "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
  "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
  "rope_theta": 500000.0, "hidden_act": "silu", "attention_bias": false,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "pad_token_id": null})";

// `base` with `key` set to `value` (JSON text); "" removes the key.
std::string With(const std::string& base, const std::string& key, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(base);
  if (value.empty()) {
    j.erase(key);
  } else {
    j[key] = nlohmann::json::parse(value);
  }
  return j.dump();
}

void ExpectInvalid(const std::string& json, const std::string& text) {
  try {
    ParseHfConfig(json, "config.json");
    FAIL() << "expected std::invalid_argument containing '" << text << "' for " << json;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(HfConfig, ReadsLlama3InTransformers4Form) {
  const HfLlamaConfig c = ParseHfConfig(kLlama3, "config.json");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 128);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias || c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, std::vector<int64_t>(3, 0));
  EXPECT_FALSE(c.pad_token_id.has_value());
  ASSERT_TRUE(c.dtype.has_value());
  EXPECT_EQ(*c.dtype, at::kBFloat16);
  EXPECT_EQ(c.json, kLlama3);
}

TEST(HfConfig, ReadsTransformers5Form) {
  // rope_parameters holds rope_theta; dtype replaces torch_dtype; head_dim
  // apart from hidden_size / heads; attention_bias on q, k, v and o.
  const std::string json = R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 2,
    "head_dim": 6, "attention_bias": true, "mlp_bias": true, "dtype": "float32",
    "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
    "pad_token_id": 3})";
  const HfLlamaConfig c = ParseHfConfig(json, "config.json");
  EXPECT_EQ(c.head_dim, 6);
  EXPECT_EQ(c.num_key_value_heads, 2) << "Llama: as many key/value heads as heads by default";
  EXPECT_DOUBLE_EQ(c.rope_theta, 1000.0);
  EXPECT_EQ(c.rope.type, RopeType::kLinear);
  EXPECT_TRUE(c.qkv_bias && c.o_bias && c.mlp_bias);
  EXPECT_EQ(*c.dtype, at::kFloat);
  EXPECT_EQ(*c.pad_token_id, 3);
}

TEST(HfConfig, MistralAndQwen2DefaultsBiasesAndWindows) {
  const std::string base = R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 12,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2})";
  // Mistral: no biases whatever attention_bias says; one window everywhere.
  HfLlamaConfig m = ParseHfConfig(
      With(With(base, "model_type", "\"mistral\""), "sliding_window", "4"), "c");
  EXPECT_FALSE(m.qkv_bias || m.o_bias || m.mlp_bias);
  EXPECT_EQ(m.sliding_window, std::vector<int64_t>(3, 4));
  m = ParseHfConfig(With(With(base, "model_type", "\"mistral\""), "sliding_window", "null"), "c");
  EXPECT_EQ(m.sliding_window, std::vector<int64_t>(3, 0)) << "null: no window";
  m = ParseHfConfig(With(base, "model_type", "\"mistral\""), "c");
  EXPECT_EQ(m.sliding_window, std::vector<int64_t>(3, 4096)) << "absent: transformers' default";

  // Qwen2: q, k, v biases only; windows only with use_sliding_window.
  const std::string qwen = With(With(base, "model_type", "\"qwen2\""), "sliding_window", "5");
  HfLlamaConfig q = ParseHfConfig(qwen, "c");
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.o_bias || q.mlp_bias);
  EXPECT_EQ(q.sliding_window, std::vector<int64_t>(3, 0));
  q = ParseHfConfig(With(With(qwen, "use_sliding_window", "true"), "max_window_layers", "1"), "c");
  EXPECT_EQ(q.sliding_window, (std::vector<int64_t>{0, 5, 5}));
  q = ParseHfConfig(
      With(With(qwen, "use_sliding_window", "true"), "layer_types",
           R"(["sliding_attention", "full_attention", "sliding_attention"])"),
      "c");
  EXPECT_EQ(q.sliding_window, (std::vector<int64_t>{5, 0, 5}));
  EXPECT_TRUE(ParseHfConfig(With(qwen, "tie_word_embeddings", "true"), "c").tie_word_embeddings);
  const std::string qwen32 = With(With(With(With(base, "model_type", "\"qwen2\""),
                                             "num_key_value_heads", ""),
                                        "num_attention_heads", "32"),
                                   "hidden_size", "64");
  EXPECT_EQ(ParseHfConfig(qwen32, "c").num_key_value_heads, 32) << "Qwen2's default";
  EXPECT_EQ(ParseHfConfig(qwen32, "c").head_dim, 2);
}

TEST(HfConfig, WhatTheModelCannotRepresentIsRefusedByName) {
  const std::string c = kLlama3;
  ExpectInvalid("{\"model_type\": ", "config.json is not valid JSON");
  ExpectInvalid(With(c, "vocab_size", ""), "\"vocab_size\" is missing");
  ExpectInvalid(With(c, "model_type", ""), "\"model_type\" is missing");
  ExpectInvalid(With(c, "model_type", "\"gpt2\""), "\"model_type\" is \"gpt2\"; supported: llama");
  ExpectInvalid(With(c, "architectures", "[\"GPT2LMHeadModel\"]"), "\"architectures\"");
  ExpectInvalid(With(c, "hidden_size", "-64"), "\"hidden_size\" must be a positive integer");
  ExpectInvalid(With(c, "num_key_value_heads", "3"), "\"num_key_value_heads\" (3) must divide");
  ExpectInvalid(With(c, "hidden_act", "\"gelu\""), "\"hidden_act\" is \"gelu\"");
  ExpectInvalid(With(c, "attention_dropout", "0.1"), "\"attention_dropout\" must be 0");
  ExpectInvalid(With(c, "partial_rotary_factor", "0.5"), "\"partial_rotary_factor\"");
  ExpectInvalid(With(c, "quantization_config", "{\"bits\": 4}"), "\"quantization_config\"");
  ExpectInvalid(With(c, "head_dim", "15"), "\"head_dim\" must be even");
  ExpectInvalid(With(c, "pad_token_id", "500"), "\"pad_token_id\" must be a token id");
  ExpectInvalid(With(c, "torch_dtype", "\"int8\""), "\"torch_dtype\" is \"int8\"");
  ExpectInvalid(With(c, "rope_scaling", R"({"rope_type": "yarn", "factor": 4.0})"),
                "rope_scaling: \"rope_type\" is \"yarn\"; supported: default, linear, llama3");
  ExpectInvalid(With(c, "rope_scaling", R"({"type": "dynamic", "factor": 4.0})"),
                "\"rope_type\" is \"dynamic\"");
  ExpectInvalid(With(c, "rope_scaling",
                     R"({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})"),
                "\"low_freq_factor\" is missing (rope_type llama3)");
  const std::string qwen = With(With(c, "model_type", "\"qwen2\""), "use_sliding_window", "true");
  ExpectInvalid(With(qwen, "layer_types", R"(["full_attention"])"),
                "\"layer_types\" must list one type per layer (3)");
  ExpectInvalid(With(qwen, "layer_types", R"(["full_attention", "chunked", "full_attention"])"),
                "\"layer_types\" has \"chunked\"");
}

// Integer fields must be integers in range wherever they appear, also
// those the model does not use: a float, a string, an exponent-written
// number or a negative value is refused naming the field.
TEST(HfConfig, IntegerFieldsAreIntegersInRange) {
  const std::string c = kLlama3;
  for (const char* bad : {"1e-300", "4096.5", "4096.0", "1e3", "\"4096\"", "0", "-4096", "true"}) {
    ExpectInvalid(With(c, "max_position_embeddings", bad),
                  "\"max_position_embeddings\" must be a positive integer, got ");
  }
  ExpectInvalid(With(c, "vocab_size", "1e-300"), "\"vocab_size\" must be a positive integer");
  ExpectInvalid(With(c, "num_hidden_layers", "2.5"),
                "\"num_hidden_layers\" must be a positive integer");
  ExpectInvalid(With(c, "pretraining_tp", "0.5"), "\"pretraining_tp\" must be a positive integer");
  ExpectInvalid(With(c, "bos_token_id", "1e-300"), "\"bos_token_id\" must be a non-negative integer");
  ExpectInvalid(With(c, "eos_token_id", "-1"), "\"eos_token_id\" must be a non-negative integer");
  ExpectInvalid(With(c, "eos_token_id", "[128001, 0.5]"),
                "\"eos_token_id\" must be a non-negative integer, got 0.5");
  ExpectInvalid(With(c, "max_window_layers", "1e-300"),
                "\"max_window_layers\" must be a non-negative integer");
  ExpectInvalid(With(c, "head_dim", "16.0"), "\"head_dim\" must be a positive integer");
  // What published configs hold is read; null means absent.
  HfLlamaConfig ok = ParseHfConfig(
      With(With(With(With(c, "max_position_embeddings", "131072"), "bos_token_id", "128000"),
                "eos_token_id", "[128001, 128008, 128009]"),
           "pretraining_tp", "1"),
      "config.json");
  EXPECT_EQ(ok.max_position_embeddings, 131072);
  EXPECT_EQ(ParseHfConfig(With(c, "max_position_embeddings", "null"), "c").max_position_embeddings,
            0);
  EXPECT_EQ(ParseHfConfig(With(c, "eos_token_id", "null"), "c").max_position_embeddings, 0);
}

// Inverse frequencies computed here in double, apart from the float32 ops
// under test.
std::vector<double> DefaultInvFreq(double theta, int64_t dim) {
  std::vector<double> inv;
  for (int64_t i = 0; i < dim; i += 2) inv.push_back(1.0 / std::pow(theta, double(i) / dim));
  return inv;
}

void ExpectClose(const at::Tensor& got, const std::vector<double>& want) {
  ASSERT_EQ(got.scalar_type(), at::kFloat);
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[static_cast<int64_t>(i)].item<double>(), want[i], 1e-6 * want[i]) << "i=" << i;
  }
}

TEST(HfConfig, RotaryFrequenciesOfEachScaling) {
  HfLlamaConfig c = ParseHfConfig(With(kLlama3, "rope_scaling", ""), "c");
  const std::vector<double> base = DefaultInvFreq(500000.0, 16);
  ExpectClose(RopeInvFreq(c), base);

  c.rope.type = RopeType::kLinear;
  c.rope.factor = 4.0;
  std::vector<double> linear = base;
  for (double& f : linear) f /= 4.0;
  ExpectClose(RopeInvFreq(c), linear);

  // Llama 3 (factor 8, low 1, high 4, 8192 positions): wavelengths under
  // 2048 stay, over 8192 are slowed 8x, the band between is blended. With
  // theta 5e5 and head_dim 16 all three bands occur (4, 1 and 3 entries).
  c = ParseHfConfig(kLlama3, "c");
  std::vector<double> llama3;
  int bands[3] = {0, 0, 0};
  for (double inv : base) {
    const double wavelen = 2 * M_PI / inv;
    if (wavelen < 8192.0 / 4) {
      llama3.push_back(inv);
      ++bands[0];
    } else if (wavelen > 8192.0 / 1) {
      llama3.push_back(inv / 8);
      ++bands[2];
    } else {
      const double s = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      llama3.push_back((1 - s) * inv / 8 + s * inv);
      ++bands[1];
    }
  }
  EXPECT_EQ(bands[0], 4);
  EXPECT_EQ(bands[1], 1);
  EXPECT_EQ(bands[2], 3);
  ExpectClose(RopeInvFreq(c), llama3);
}

TEST(HfConfig, LoadsConfigJsonFromADirectory) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(tmp ? tmp : "/tmp") / "hf_config_dir";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << kLlama3;
  EXPECT_EQ(LoadHfConfig(dir.string()).num_hidden_layers, 3);
  try {
    LoadHfConfig((dir / "nothing").string());
    FAIL() << "expected a missing config.json to throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("has no config.json"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "config.json") << With(kLlama3, "hidden_act", "\"relu\"");
  try {
    LoadHfConfig(dir.string());
    FAIL() << "expected hidden_act relu to be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "config.json").string() + ": \"hidden_act\""),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace models
}  // namespace fsdp2
