// fsdp2/c_api/internal/builtin_modules.h
//
// The TrainingModules behind fsdp2_model_t: the model families a C caller
// can build from JSON (core/models' GPTModule and MLPModule, predicting
// logits / outputs as float) and TorchScript files. Each checks the batch
// it is given before any collective runs and says exactly what is wrong
// (ShapeError / InvalidArgumentError), turns a batch into a loss, and
// builds its optimizer (strategy::MakeOptimizer) from the options connect()
// received.
#ifndef FSDP2_C_API_INTERNAL_BUILTIN_MODULES_H_
#define FSDP2_C_API_INTERNAL_BUILTIN_MODULES_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "c_api/fsdp2.h"
#include "core/strategy/training_module.h"

namespace fsdp2 {
namespace c_api {

class BuiltinModule : public strategy::TrainingModule {
 public:
  // Called by fsdp2_strategy_connect before parallelize.
  void set_optimizer_options(const fsdp2_optimizer_options_t& options) {
    optimizer_ = options;
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() override;

  at::Tensor training_step(const strategy::Batch& batch, int64_t) override {
    return Loss(batch);
  }
  at::Tensor validation_step(const strategy::Batch& batch, int64_t) override {
    return Loss(batch);
  }
  at::Tensor predict_step(const strategy::Batch& batch, int64_t) override;

  // The prediction's shape for this batch (checks the batch's inputs).
  virtual std::vector<int64_t> PredictShape(const strategy::Batch& batch) = 0;
  // Throws ShapeError unless `batch` has what Loss() needs.
  virtual void CheckBatch(const strategy::Batch& batch) = 0;
  // The family: "gpt", "mlp" or "torchscript".
  virtual std::string family() const = 0;

 protected:
  virtual at::Tensor Loss(const strategy::Batch& batch) = 0;
  virtual at::Tensor Predict(const strategy::Batch& batch) = 0;

 private:
  fsdp2_optimizer_options_t optimizer_{};  // struct_size 0: defaults
};

// Builds a family from its JSON configuration (see fsdp2_model_create).
// Throws std::invalid_argument on bad JSON, unknown families or keys.
std::shared_ptr<BuiltinModule> CreateBuiltinModule(const std::string& json);

// Loads a TorchScript file with its options (a JSON object: "loss",
// "auto_wrap"; see fsdp2_model_load_torchscript_with_options).
std::shared_ptr<BuiltinModule> LoadTorchScriptModule(const std::string& path,
                                                     const std::string& options_json);

}  // namespace c_api
}  // namespace fsdp2

#endif  // FSDP2_C_API_INTERNAL_BUILTIN_MODULES_H_
