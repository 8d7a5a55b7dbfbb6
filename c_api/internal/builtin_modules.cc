#include "c_api/internal/builtin_modules.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>

#include "core/common/error.h"
#include "core/fsdp/fully_shard.h"
#include "core/models/gpt_module.h"
#include "core/models/hf_config.h"
#include "core/models/llama_module.h"
#include "core/models/mlp_module.h"
#include "core/script/script_model.h"
#include "core/strategy/hf_model.h"
#include "core/strategy/optimizer.h"
#include "c_api/internal/tensors.h"

namespace fsdp2 {
namespace c_api {
namespace {

namespace F = torch::nn::functional;
using strategy::Batch;

std::string ShapeString(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes() << " " << t.dtype();
  return s.str();
}

void RequireTensors(const Batch& batch, size_t n, const char* what) {
  if (batch.size() < n) {
    throw ShapeError("the batch has " + std::to_string(batch.size()) +
                     " tensor(s); this model needs " + what);
  }
}

bool IsInteger(const at::Tensor& t) {
  return t.scalar_type() == at::kLong || t.scalar_type() == at::kInt ||
         t.scalar_type() == at::kByte;
}

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

// Token ids: a 2-D integer tensor [B, T] of ids below `vocab_size`.
void CheckTokenIds(const at::Tensor& t, const char* name, int64_t vocab_size) {
  if (t.dim() != 2 || !IsInteger(t)) {
    throw ShapeError(std::string(name) + " must be a 2-D integer tensor [B, T], got " +
                     ShapeString(t));
  }
  if (t.numel() > 0) {
    const int64_t lo = t.min().item<int64_t>(), hi = t.max().item<int64_t>();
    if (lo < 0 || hi >= vocab_size) {
      throw InvalidArgumentError(std::string(name) + " hold token " +
                                 std::to_string(lo < 0 ? lo : hi) +
                                 ", outside the vocabulary [0, " + std::to_string(vocab_size) +
                                 ")");
    }
  }
}

// A next-token language model: batch {tokens [B,T], targets [B,T]} of
// token ids, prediction logits [B,T,vocab_size]; the batch is checked
// before any collective runs.
class TokenModelFamily : public BuiltinModule {
 public:
  void CheckBatch(const Batch& batch) override {
    RequireTensors(batch, 2, "{tokens [B,T], targets [B,T]}");
    CheckTokens(batch[0], "tokens");
    CheckTokens(batch[1], "targets");
    if (!batch[0].sizes().equals(batch[1].sizes())) {
      throw ShapeError("targets " + ShapeString(batch[1]) +
                       " must have the shape of tokens " + ShapeString(batch[0]));
    }
  }
  std::vector<int64_t> PredictShape(const Batch& batch) override {
    RequireTensors(batch, 1, "{tokens [B,T]}");
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
  explicit GPTFamily(const models::GPTConfig& config)
      : core_(std::make_shared<models::GPTModule>(config)) {}
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
  std::shared_ptr<models::GPTModule> core_;
};

// The Hugging Face family: a Llama, Mistral or Qwen2 checkpoint through
// core/models' LlamaModule, whose weights FSDP2Strategy::parallelize()
// loads (HfModel).
class HfFamily : public TokenModelFamily, public strategy::HfModel {
 public:
  explicit HfFamily(std::shared_ptr<models::LlamaModule> core) : core_(std::move(core)) {}
  std::shared_ptr<torch::nn::Module> module() override { return core_->module(); }
  std::string family() const override { return "hf"; }
  std::string hf_weights_path() const override { return core_->hf_weights_path(); }
  std::string hf_config_json(at::ScalarType dtype) const override {
    return core_->hf_config_json(dtype);
  }

 protected:
  int64_t vocab_size() const override { return core_->config().vocab_size; }
  at::Tensor CoreLoss(const Batch& batch) override { return core_->loss(batch); }
  at::Tensor CoreLogits(const at::Tensor& tokens) override { return core_->logits(tokens); }

 private:
  std::shared_ptr<models::LlamaModule> core_;
};

// The MLP family: core/models' MLPModule, with the batch (inputs and
// targets) checked first, so a bad batch is a ShapeError before any
// collective runs, and floating-point inputs of any precision.
class MLPFamily : public BuiltinModule {
 public:
  explicit MLPFamily(const models::MLPConfig& config)
      : core_(std::make_shared<models::MLPModule>(config)) {}
  std::shared_ptr<torch::nn::Module> module() override { return core_->module(); }
  std::string family() const override { return "mlp"; }

  void CheckBatch(const Batch& batch) override {
    RequireTensors(batch, 2, "{x [B,in], y [B,out] or [B]}");
    CheckInput(batch[0]);
    CheckTargets(batch[0].size(0), batch[1]);
  }
  std::vector<int64_t> PredictShape(const Batch& batch) override {
    RequireTensors(batch, 1, "{x [B,in]}");
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
  const models::MLPConfig& config() const { return core_->config(); }
  void CheckInput(const at::Tensor& x) const {
    if (x.dim() != 2 || x.size(1) != config().in_features || !x.is_floating_point()) {
      throw ShapeError("x must be a floating-point [B, " +
                       std::to_string(config().in_features) + "] tensor, got " +
                       ShapeString(x));
    }
  }
  // MSE needs floating targets of the output's shape [B, out]; cross-entropy
  // class indices [B] in [0, out).
  void CheckTargets(int64_t rows, const at::Tensor& y) const {
    const int64_t classes = config().out_features;
    if (IsInteger(y)) {
      if (y.dim() != 1 || y.size(0) != rows) {
        throw ShapeError("class targets must be [B] = [" + std::to_string(rows) + "], got " +
                         ShapeString(y));
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
        << "], got " << ShapeString(y);
      throw ShapeError(s.str());
    }
  }
  std::shared_ptr<models::MLPModule> core_;
};

// A TorchScript module (core/script's ScriptModel: one FSDP unit per
// wrapped submodule, then the root). Every batch tensor but the target goes
// to the script's forward, positionally; with the loss "model" all of them
// do and the forward returns the loss.
class TorchScriptModule : public BuiltinModule {
 public:
  TorchScriptModule(script::ScriptModel model, std::string loss)
      : model_(std::move(model)), loss_(std::move(loss)) {
    for (const auto& p : model_->parameters()) {
      if (p.is_floating_point()) {
        float_dtype_ = p.scalar_type();
        break;
      }
    }
  }
  std::shared_ptr<torch::nn::Module> module() override { return model_.ptr(); }
  std::string family() const override { return "torchscript"; }

  void CheckBatch(const Batch& batch) override {
    const size_t targets = loss_ == "model" ? 0 : 1;
    RequireTensors(batch, targets + 1, loss_ == "model" ? "{the forward's inputs}"
                                                          : "{the forward's inputs..., target}");
    CheckArity(batch.size() - targets, targets);
  }
  std::vector<int64_t> PredictShape(const Batch& batch) override {
    RequireTensors(batch, 1, "{the forward's inputs...}");
    at::NoGradGuard no_grad;
    return Predict(batch).sizes().vec();  // the script's shape rules are its own
  }

 protected:
  at::Tensor Loss(const Batch& batch) override {
    CheckBatch(batch);
    if (loss_ == "model") {
      c10::IValue out = Run(batch, batch.size());
      if (!out.isTensor() || out.toTensor().dim() != 0 ||
          !out.toTensor().is_floating_point()) {
        throw InvalidArgumentError(
            "with \"loss\": \"model\" the script's forward must return the loss as a "
            "floating-point scalar tensor; it returned " + Describe(out));
      }
      return out.toTensor();
    }
    at::Tensor out = OutputTensor(Run(batch, batch.size() - 1));
    const at::Tensor& target = batch.back();
    if (loss_ == "cross_entropy") {
      if (!IsInteger(target)) throw ShapeError("cross_entropy needs integer class targets");
      return F::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}).to(at::kLong));
    }
    if (!target.sizes().equals(out.sizes())) {
      std::ostringstream s;
      s << "mse targets must have the output's shape " << out.sizes() << ", got "
        << ShapeString(target);
      throw ShapeError(s.str());
    }
    return F::mse_loss(out, target.to(out.scalar_type()));
  }
  // The forward's inputs are the batch's first tensors (a predict batch may
  // carry its targets too).
  at::Tensor Predict(const Batch& batch) override {
    const size_t n = std::min(batch.size(), model_->num_inputs());
    CheckArity(n, 0);
    return OutputTensor(Run(batch, n));
  }

 private:
  c10::IValue Run(const Batch& batch, size_t n) {
    std::vector<c10::IValue> inputs;
    for (size_t i = 0; i < n; ++i) {
      inputs.emplace_back(batch[i].is_floating_point() ? batch[i].to(float_dtype_) : batch[i]);
    }
    return model_->forward(std::move(inputs));
  }
  void CheckArity(size_t given, size_t targets) const {
    const size_t most = model_->num_inputs(), least = model_->num_required_inputs();
    if (given >= least && given <= most) return;
    std::string names;
    for (const std::string& n : model_->input_names()) names += (names.empty() ? "" : ", ") + n;
    std::string takes = least == most ? std::to_string(most)
                                      : std::to_string(least) + " to " + std::to_string(most);
    throw ShapeError("the script's forward(" + names + ") takes " + takes +
                     " input(s), but the batch gives " + std::to_string(given) +
                     (targets ? " (every tensor but the last, the " + loss_ + " target)"
                              : std::string(" (every tensor: the loss is the model's)")));
  }
  static std::string Describe(const c10::IValue& v) {
    if (!v.isTensor()) return "a " + v.tagKind();
    std::ostringstream s;
    s << "a tensor of shape " << v.toTensor().sizes() << " " << v.toTensor().dtype();
    return s.str();
  }
  static at::Tensor OutputTensor(const c10::IValue& out) {
    if (!out.isTensor()) {
      throw InvalidArgumentError("the TorchScript module's forward must return a tensor, not " +
                                 Describe(out));
    }
    return out.toTensor();
  }

  script::ScriptModel model_;
  std::string loss_;
  at::ScalarType float_dtype_ = at::kFloat;
};

}  // namespace

std::unique_ptr<torch::optim::Optimizer> BuiltinModule::configure_optimizers() {
  fsdp2_optimizer_options_t o = optimizer_;
  if (o.struct_size == 0) fsdp2_optimizer_options_init(&o);
  strategy::OptimizerOptions options;
  switch (o.kind) {
    case FSDP2_OPTIMIZER_ADAMW: options.kind = strategy::OptimizerKind::kAdamW; break;
    case FSDP2_OPTIMIZER_ADAM: options.kind = strategy::OptimizerKind::kAdam; break;
    case FSDP2_OPTIMIZER_SGD: options.kind = strategy::OptimizerKind::kSGD; break;
    default: throw InvalidArgumentError("unknown optimizer kind " + std::to_string(o.kind));
  }
  options.lr = o.lr;
  options.beta1 = o.beta1;
  options.beta2 = o.beta2;
  options.eps = o.eps;
  options.weight_decay = o.weight_decay;
  options.momentum = o.momentum;
  // Frozen parameters (frozen_params) get no optimizer state.
  std::vector<at::Tensor> trained;
  for (const at::Tensor& p : module()->parameters()) {
    if (p.requires_grad()) trained.push_back(p);
  }
  if (trained.empty()) {
    throw InvalidArgumentError("every parameter of the model is frozen (frozen_params): nothing "
                               "to train");
  }
  return strategy::MakeOptimizer(trained, options);
}

at::Tensor BuiltinModule::predict_step(const strategy::Batch& batch, int64_t) {
  return Predict(batch);
}

std::shared_ptr<BuiltinModule> CreateBuiltinModule(const std::string& text) {
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
    models::GPTConfig c;
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
    return std::make_shared<GPTFamily>(c);
  }
  if (family == "mlp") {
    models::MLPConfig c;
    ReadSizes(config, family,
              {{"in_features", &c.in_features},
               {"hidden", &c.hidden},
               {"out_features", &c.out_features},
               {"depth", &c.depth}});
    return std::make_shared<MLPFamily>(c);
  }
  if (family == "hf") {
    std::string path;
    std::optional<at::ScalarType> dtype;
    for (const auto& [key, value] : config.items()) {
      if (key == "family") continue;
      if (key == "path" && value.is_string()) {
        path = value.get<std::string>();
      } else if (key == "dtype" && value.is_string()) {
        dtype = FloatTypeOfName(value.get<std::string>());
      } else {
        throw InvalidArgumentError("model \"hf\": \"" + key + "\" = " + value.dump() +
                                   " (known: family, path: the checkpoint directory, dtype: "
                                   "\"float32\", \"bfloat16\", \"float16\", \"float64\")");
      }
    }
    if (path.empty()) {
      throw InvalidArgumentError("model \"hf\" needs \"path\": the checkpoint's directory");
    }
    return std::make_shared<HfFamily>(
        models::LlamaModule::FromPretrained(path, strategy::OptimizerOptions{}, dtype));
  }
  throw InvalidArgumentError("unknown model family \"" + family +
                              "\" (known: gpt, mlp, hf; TorchScript files load with "
                              "fsdp2_model_load_torchscript)");
}

std::shared_ptr<BuiltinModule> LoadTorchScriptModule(const std::string& path,
                                                     const std::string& options_json) {
  nlohmann::json options;
  try {
    options = nlohmann::json::parse(options_json);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(std::string("TorchScript options are not valid JSON: ") + e.what());
  }
  if (!options.is_object()) {
    throw InvalidArgumentError("TorchScript options must be a JSON object, got " +
                               options.dump());
  }
  std::string loss = "mse";
  script::ScriptWrapPolicy policy;
  for (const auto& [key, value] : options.items()) {
    if (key == "loss") {
      if (!value.is_string()) {
        throw InvalidArgumentError("TorchScript option \"loss\" must be a string, got " +
                                   value.dump());
      }
      loss = value.get<std::string>();
    } else if (key == "auto_wrap") {
      bool ok = value.is_array();
      std::vector<std::string> entries;
      for (const auto& e : ok ? value : nlohmann::json::array()) {
        if (!e.is_string()) ok = false;
        else entries.push_back(e.get<std::string>());
      }
      if (!ok) {
        throw InvalidArgumentError(
            "TorchScript option \"auto_wrap\" must be a list of submodule paths and class "
            "names, got " + value.dump());
      }
      policy.auto_wrap = std::move(entries);
    } else {
      throw InvalidArgumentError("unknown TorchScript option \"" + key +
                                 "\" (known: loss, auto_wrap)");
    }
  }
  if (loss != "mse" && loss != "cross_entropy" && loss != "model") {
    throw InvalidArgumentError(
        "TorchScript loss must be \"mse\", \"cross_entropy\" or \"model\", got \"" + loss +
        "\"");
  }
  script::ScriptModel model = script::LoadScriptModel(path, policy);
  int64_t trainable = 0, total = 0;
  for (const auto& p : model->script().parameters()) {
    ++total;
    trainable += p.requires_grad() ? 1 : 0;
  }
  if (trainable == 0) {
    throw InvalidArgumentError("TorchScript module " + path + " has no trainable parameters (" +
                               std::to_string(total) +
                               " parameters, none with requires_grad); nothing to train");
  }
  return std::make_shared<TorchScriptModule>(std::move(model), loss);
}

}  // namespace c_api
}  // namespace fsdp2
