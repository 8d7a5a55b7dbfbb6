// fsdp2/core/models/model_family.h
//
// ModelFamily: a TrainingModule that a front end can train knowing nothing
// of the model inside. It checks a batch before any collective runs (a
// ShapeError or InvalidArgumentError that says what is wrong and what was
// expected), says what shape its prediction has, and builds its optimizer
// from options given after it was made. The built-in families
// (builtin_families.h: GPT, MLP, Hugging Face Llama family) and TorchScript
// files (core/script/script_family.h) are ModelFamilies; the C ABI's
// fsdp2_model_t holds one, and a C++ program can train one directly with
// FSDP2Strategy.
#ifndef FSDP2_CORE_MODELS_MODEL_FAMILY_H_
#define FSDP2_CORE_MODELS_MODEL_FAMILY_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/strategy/optimizer.h"
#include "core/strategy/training_module.h"

namespace fsdp2 {
namespace models {

class ModelFamily : public strategy::TrainingModule {
 public:
  // The optimizer configure_optimizers() builds (default: the
  // OptimizerOptions defaults, AdamW). Set before the strategy's
  // parallelize().
  void set_optimizer_options(const strategy::OptimizerOptions& options) {
    optimizer_ = options;
  }
  // The optimizer over the parameters that require gradients (frozen ones
  // get no state). InvalidArgumentError when every parameter is frozen.
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() override;

  // The loss of a checked batch (CheckBatch's errors otherwise).
  at::Tensor training_step(const strategy::Batch& batch, int64_t) override {
    return Loss(batch);
  }
  at::Tensor validation_step(const strategy::Batch& batch, int64_t) override {
    return Loss(batch);
  }
  // The prediction for a checked batch (PredictShape's errors otherwise).
  at::Tensor predict_step(const strategy::Batch& batch, int64_t) override {
    return Predict(batch);
  }

  // The prediction's shape for this batch (checks the batch's inputs).
  virtual std::vector<int64_t> PredictShape(const strategy::Batch& batch) = 0;
  // Throws ShapeError (or InvalidArgumentError for bad values) unless
  // `batch` has what the loss needs.
  virtual void CheckBatch(const strategy::Batch& batch) = 0;
  // The family: "gpt", "mlp", "hf" or "torchscript".
  virtual std::string family() const = 0;

 protected:
  virtual at::Tensor Loss(const strategy::Batch& batch) = 0;
  virtual at::Tensor Predict(const strategy::Batch& batch) = 0;

 private:
  strategy::OptimizerOptions optimizer_;
};

// ---- what the families' batch checks share

// "[2, 3] float": a tensor's shape and dtype, for messages.
std::string DescribeTensor(const at::Tensor& t);
// Throws ShapeError unless `batch` holds at least `n` tensors; `what` says
// which ("{tokens [B,T], targets [B,T]}").
void RequireBatchTensors(const strategy::Batch& batch, size_t n, const char* what);
// Whether `t` holds integers a batch may carry as ids or classes (int64,
// int32 or uint8).
bool IsIntegerTensor(const at::Tensor& t);

}  // namespace models
}  // namespace fsdp2

#endif  // FSDP2_CORE_MODELS_MODEL_FAMILY_H_
