#include "core/models/builtin_families.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <sstream>

#include "core/common/error.h"
#include "core/models/gpt_module.h"
#include "core/models/hf_config.h"
#include "core/models/llama_module.h"
#include "core/models/mlp_module.h"
#include "core/models/model_size.h"
#include "core/strategy/hf_model.h"
#include "core/strategy/option_table.h"

namespace fsdp2 {
namespace models {
namespace {

using strategy::Batch;

// Reads the keys of `config` into `fields`, refusing unknown keys and
// values that are not positive integers.
void ReadSizes(const nlohmann::json& config, const std::string& family,
               const std::map<std::string, int64_t*>& fields) {
  for (const auto& [key, value] : config.items()) {
    if (key == "family") continue;
    auto it = fields.find(key);
    if (it == fields.end()) {
      std::string known;
      for (const auto& f : fields) known += (known.empty() ? "" : ", ") + f.first;
      throw InvalidArgumentError("model \"" + family + "\": unknown key \"" + key +
                                  "\" (known: family, " + known + ")");
    }
    if (!value.is_number_integer() || value.get<int64_t>() < 1) {
      throw InvalidArgumentError("model \"" + family + "\": \"" + key +
                                  "\" must be a positive integer, got " + value.dump());
    }
    *it->second = value.get<int64_t>();
  }
}

// "q_proj,v_proj" or ["q_proj", "v_proj"]: LoRA's target module names.
std::vector<std::string> ParseLoraTargets(const nlohmann::json& value) {
  if (value.is_string()) return strategy::SplitNames(value.get<std::string>());
  std::vector<std::string> names;
  for (const auto& v : value) {
    if (!v.is_string()) {
      throw InvalidArgumentError("model \"hf\": lora_target_modules must hold names, got " +
                                 value.dump());
    }
    names.push_back(v.get<std::string>());
  }
  return names;
}

// Token ids: a 2-D integer tensor [B, T] of ids below `vocab_size` (or
// the ignore index -100, where `ignore_allowed`: masked targets).
void CheckTokenIds(const at::Tensor& t, const char* name, int64_t vocab_size,
                   bool ignore_allowed = false) {
  if (t.dim() != 2 || !IsIntegerTensor(t)) {
    throw ShapeError(std::string(name) + " must be a 2-D integer tensor [B, T], got " +
                     DescribeTensor(t));
  }
  const at::Tensor counted = ignore_allowed ? t.masked_select(t.ne(-100)) : t;
  if (counted.numel() > 0) {
    const int64_t lo = counted.min().item<int64_t>(), hi = counted.max().item<int64_t>();
    if (lo < 0 || hi >= vocab_size) {
      throw InvalidArgumentError(std::string(name) + " hold token " +
                                 std::to_string(lo < 0 ? lo : hi) +
                                 ", outside the vocabulary [0, " + std::to_string(vocab_size) +
                                 ")" + (ignore_allowed ? " (or -100: not learned)" : ""));
    }
  }
}

// A next-token language model: batch {tokens [B,T], targets [B,T]} of
// token ids, prediction logits [B,T,vocab_size]; the batch is checked
// before any collective runs.
class TokenModelFamily : public ModelFamily {
 public:
  void CheckBatch(const Batch& batch) override {
    RequireBatchTensors(batch, 2, "{tokens [B,T], targets [B,T]}");
    CheckTokens(batch[0], "tokens");
    CheckTokens(batch[1], "targets");
    if (!batch[0].sizes().equals(batch[1].sizes())) {
      throw ShapeError("targets " + DescribeTensor(batch[1]) +
                       " must have the shape of tokens " + DescribeTensor(batch[0]));
    }
  }
  std::vector<int64_t> PredictShape(const Batch& batch) override {
    RequireBatchTensors(batch, 1, "{tokens [B,T]}");
    CheckTokens(batch[0], "tokens");
    return {batch[0].size(0), batch[0].size(1), vocab_size()};
  }

 protected:
  at::Tensor Loss(const Batch& batch) override {
    CheckBatch(batch);
    return CoreLoss(batch);
  }
  at::Tensor Predict(const Batch& batch) override {
    PredictShape(batch);
    return CoreLogits(batch[0]);
  }
  virtual int64_t vocab_size() const = 0;
  // Throws unless `t` holds token ids the model takes.
  virtual void CheckTokens(const at::Tensor& t, const char* name) const {
    CheckTokenIds(t, name, vocab_size());
  }
  virtual at::Tensor CoreLoss(const Batch& batch) = 0;
  virtual at::Tensor CoreLogits(const at::Tensor& tokens) = 0;
};

// The GPT family: core/models' GPTModule, predicting logits [B, T, vocab]
// rather than next tokens.
class GPTFamily : public TokenModelFamily {
 public:
  explicit GPTFamily(const GPTConfig& config)
      : core_(std::make_shared<GPTModule>(config)) {}
  std::shared_ptr<torch::nn::Module> module() override { return core_->module(); }
  std::string family() const override { return "gpt"; }

 protected:
  int64_t vocab_size() const override { return core_->gpt()->config().vocab_size; }
  void CheckTokens(const at::Tensor& t, const char* name) const override {
    TokenModelFamily::CheckTokens(t, name);
    const int64_t block_size = core_->gpt()->config().block_size;
    if (t.size(1) < 1 || t.size(1) > block_size) {
      throw ShapeError(std::string(name) + " has " + std::to_string(t.size(1)) +
                       " tokens per row; the model takes 1 to block_size = " +
                       std::to_string(block_size));
    }
  }
  at::Tensor CoreLoss(const Batch& batch) override { return core_->loss(batch); }
  at::Tensor CoreLogits(const at::Tensor& tokens) override { return core_->logits(tokens); }

 private:
  std::shared_ptr<GPTModule> core_;
};

// The Hugging Face family: a Llama, Mistral or Qwen2 checkpoint through
// core/models' LlamaModule, whose weights FSDP2Strategy::parallelize()
// loads (HfModel).
class HfFamily : public TokenModelFamily, public strategy::HfModel {
 public:
  explicit HfFamily(std::shared_ptr<LlamaModule> core) : core_(std::move(core)) {}
  std::shared_ptr<torch::nn::Module> module() override { return core_->module(); }
  std::string family() const override { return "hf"; }
  std::string hf_weights_path() const override { return core_->hf_weights_path(); }
  std::string hf_config_json(at::ScalarType dtype) const override {
    return core_->hf_config_json(dtype);
  }
  strategy::HfLora hf_lora() const override { return core_->hf_lora(); }
  int64_t loss_items(const Batch& batch) override { return core_->loss_items(batch); }

  // {tokens, targets} or {tokens, targets, segments}: targets may hold the
  // ignore index -100 (prompt tokens, padding), segments [B, T] pack
  // documents (LlamaModule::loss).
  void CheckBatch(const Batch& batch) override {
    RequireBatchTensors(batch, 2, "{tokens [B,T], targets [B,T]} or {..., segments [B,T]}");
    if (batch.size() > 3) {
      throw ShapeError("a batch is {tokens [B,T], targets [B,T]} or {tokens, targets, "
                       "segments [B,T]}, got " + std::to_string(batch.size()) + " tensors");
    }
    CheckTokens(batch[0], "tokens");
    CheckTokenIds(batch[1], "targets", vocab_size(), /*ignore_allowed=*/true);
    for (size_t i = 1; i < batch.size(); ++i) {
      if (!batch[0].sizes().equals(batch[i].sizes()) || !IsIntegerTensor(batch[i])) {
        throw ShapeError(std::string(i == 1 ? "targets " : "segments ") +
                         DescribeTensor(batch[i]) +
                         " must be integers of the shape of tokens " + DescribeTensor(batch[0]));
      }
    }
  }

 protected:
  int64_t vocab_size() const override { return core_->config().vocab_size; }
  at::Tensor CoreLoss(const Batch& batch) override { return core_->loss(batch); }
  at::Tensor CoreLogits(const at::Tensor& tokens) override { return core_->logits(tokens); }

 private:
  std::shared_ptr<LlamaModule> core_;
};

// The MLP family: core/models' MLPModule, with the batch (inputs and
// targets) checked first, so a bad batch is a ShapeError before any
// collective runs, and floating-point inputs of any precision.
class MLPFamily : public ModelFamily {
 public:
  explicit MLPFamily(const MLPConfig& config)
      : core_(std::make_shared<MLPModule>(config)) {}
  std::shared_ptr<torch::nn::Module> module() override { return core_->module(); }
  std::string family() const override { return "mlp"; }

  void CheckBatch(const Batch& batch) override {
    RequireBatchTensors(batch, 2, "{x [B,in], y [B,out] or [B]}");
    CheckInput(batch[0]);
    CheckTargets(batch[0].size(0), batch[1]);
  }
  std::vector<int64_t> PredictShape(const Batch& batch) override {
    RequireBatchTensors(batch, 1, "{x [B,in]}");
    CheckInput(batch[0]);
    return {batch[0].size(0), config().out_features};
  }

 protected:
  at::Tensor Loss(const Batch& batch) override {
    CheckBatch(batch);
    return core_->loss({batch[0].to(at::kFloat), batch[1]});
  }
  at::Tensor Predict(const Batch& batch) override {
    PredictShape(batch);
    return core_->predict_step({batch[0].to(at::kFloat)}, 0).to(at::kFloat);
  }

 private:
  const MLPConfig& config() const { return core_->config(); }
  void CheckInput(const at::Tensor& x) const {
    if (x.dim() != 2 || x.size(1) != config().in_features || !x.is_floating_point()) {
      throw ShapeError("x must be a floating-point [B, " +
                       std::to_string(config().in_features) + "] tensor, got " +
                       DescribeTensor(x));
    }
  }
  // MSE needs floating targets of the output's shape [B, out]; cross-entropy
  // class indices [B] in [0, out).
  void CheckTargets(int64_t rows, const at::Tensor& y) const {
    const int64_t classes = config().out_features;
    if (IsIntegerTensor(y)) {
      if (y.dim() != 1 || y.size(0) != rows) {
        throw ShapeError("class targets must be [B] = [" + std::to_string(rows) + "], got " +
                         DescribeTensor(y));
      }
      if (y.numel() > 0 &&
          (y.min().item<int64_t>() < 0 || y.max().item<int64_t>() >= classes)) {
        throw InvalidArgumentError("class targets must lie in [0, " + std::to_string(classes) +
                                   ")");
      }
      return;
    }
    if (!y.is_floating_point() || y.dim() != 2 || y.size(0) != rows || y.size(1) != classes) {
      std::ostringstream s;
      s << "regression targets must have the output's shape [" << rows << ", " << classes
        << "], got " << DescribeTensor(y);
      throw ShapeError(s.str());
    }
  }
  std::shared_ptr<MLPModule> core_;
};

}  // namespace

std::shared_ptr<ModelFamily> CreateModelFamily(const std::string& text, int64_t shards) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(std::string("model configuration is not valid JSON: ") +
                                e.what());
  }
  if (!config.is_object() || !config.contains("family") || !config["family"].is_string()) {
    throw InvalidArgumentError(
        "model configuration must be a JSON object with \"family\": \"gpt\", \"mlp\" or "
        "\"hf\"");
  }
  const std::string family = config["family"].get<std::string>();
  if (family == "gpt") {
    GPTConfig c;
    nlohmann::json sizes = config;
    if (sizes.contains("dropout")) {
      const nlohmann::json& p = sizes["dropout"];
      if (!p.is_number()) {
        throw InvalidArgumentError("model \"gpt\": \"dropout\" must be a number in [0, 1), got " +
                                   p.dump());
      }
      c.dropout = p.get<double>();
      sizes.erase("dropout");
    }
    ReadSizes(sizes, family,
              {{"vocab_size", &c.vocab_size},
               {"block_size", &c.block_size},
               {"n_layer", &c.n_layer},
               {"n_head", &c.n_head},
               {"n_embd", &c.n_embd}});
    c.Validate();
    RequireFits("model \"gpt\"", c, shards, MachineMemoryBytes());
    return std::make_shared<GPTFamily>(c);
  }
  if (family == "mlp") {
    MLPConfig c;
    ReadSizes(config, family,
              {{"in_features", &c.in_features},
               {"hidden", &c.hidden},
               {"out_features", &c.out_features},
               {"depth", &c.depth}});
    RequireFits("model \"mlp\"", c, shards, MachineMemoryBytes());
    return std::make_shared<MLPFamily>(c);
  }
  if (family == "hf") {
    std::string path;
    std::optional<at::ScalarType> dtype;
    LoraOptions lora;
    for (const auto& [key, value] : config.items()) {
      if (key == "family") continue;
      if (key == "path" && value.is_string()) {
        path = value.get<std::string>();
      } else if (key == "dtype" && value.is_string()) {
        dtype = FloatDtypeOfName(value.get<std::string>());
      } else if (key == "lora_rank" && value.is_number_integer()) {
        lora.rank = value.get<int64_t>();
      } else if (key == "lora_alpha" && value.is_number()) {
        lora.alpha = value.get<double>();
      } else if (key == "lora_dropout" && value.is_number()) {
        lora.dropout = value.get<double>();
      } else if (key == "lora_target_modules" && (value.is_string() || value.is_array())) {
        lora.target_modules = ParseLoraTargets(value);
      } else {
        throw InvalidArgumentError(
            "model \"hf\": \"" + key + "\" = " + value.dump() +
            " (known: family, path: the checkpoint directory, dtype: \"float32\", "
            "\"bfloat16\", \"float16\", \"float64\", lora_rank: an integer (0: no LoRA), "
            "lora_alpha and lora_dropout: numbers, lora_target_modules: \"q_proj,v_proj\" or "
            "a list of names)");
      }
    }
    const bool lora_keys = config.contains("lora_alpha") || config.contains("lora_dropout") ||
                           config.contains("lora_target_modules");
    if (lora_keys && lora.rank < 1) {
      throw InvalidArgumentError("model \"hf\": lora_alpha, lora_dropout and "
                                 "lora_target_modules need lora_rank >= 1");
    }
    if (path.empty()) {
      throw InvalidArgumentError("model \"hf\" needs \"path\": the checkpoint's directory");
    }
    HfLlamaConfig hf = LoadHfConfig(path);
    RequireFits("model \"hf\" (" + path + "/config.json)", hf, dtype.value_or(at::kFloat),
                shards, MachineMemoryBytes());
    return std::make_shared<HfFamily>(
        std::make_shared<LlamaModule>(hf, strategy::OptimizerOptions{}, dtype, path, lora));
  }
  throw InvalidArgumentError("unknown model family \"" + family +
                              "\" (known: gpt, mlp, hf; TorchScript files load with "
                              "fsdp2_model_load_torchscript, script::LoadScriptFamily in "
                              "C++)");
}

}  // namespace models
}  // namespace fsdp2
