#include "core/script/script_family.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <sstream>

#include "core/common/error.h"
#include "core/script/script_model.h"

namespace fsdp2 {
namespace script {
namespace {

namespace F = torch::nn::functional;
using strategy::Batch;

// A TorchScript module (a ScriptModel: one FSDP unit per
// wrapped submodule, then the root). Every batch tensor but the target goes
// to the script's forward, positionally; with the loss "model" all of them
// do and the forward returns the loss.
class ScriptFamily : public models::ModelFamily {
 public:
  ScriptFamily(ScriptModel model, std::string loss)
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
    models::RequireBatchTensors(batch, targets + 1, loss_ == "model" ? "{the forward's inputs}"
                                                          : "{the forward's inputs..., target}");
    CheckArity(batch.size() - targets, targets);
  }
  std::vector<int64_t> PredictShape(const Batch& batch) override {
    models::RequireBatchTensors(batch, 1, "{the forward's inputs...}");
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
      if (!models::IsIntegerTensor(target)) throw ShapeError("cross_entropy needs integer class targets");
      return F::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}).to(at::kLong));
    }
    if (!target.sizes().equals(out.sizes())) {
      std::ostringstream s;
      s << "mse targets must have the output's shape " << out.sizes() << ", got "
        << models::DescribeTensor(target);
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

  ScriptModel model_;
  std::string loss_;
  at::ScalarType float_dtype_ = at::kFloat;
};

}  // namespace

std::shared_ptr<models::ModelFamily> LoadScriptFamily(const std::string& path,
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
  ScriptWrapPolicy policy;
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
  ScriptModel model = LoadScriptModel(path, policy);
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
  return std::make_shared<ScriptFamily>(std::move(model), loss);
}

}  // namespace script
}  // namespace fsdp2
