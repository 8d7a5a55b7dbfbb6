#include "core/strategy/training_module.h"
#include "core/common/error.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace fsdp2 {
namespace strategy {

const char* ToString(StepType step) {
  switch (step) {
    case StepType::kTraining: return "training";
    case StepType::kValidation: return "validation";
    case StepType::kTest: return "test";
    case StepType::kPredict: return "predict";
  }
  return "?";
}

at::Tensor LossReduction::reduce(const std::vector<at::Tensor>& losses) {
  if (losses.empty()) {
    throw InvalidArgumentError("LossReduction::reduce: no losses");
  }
  return at::stack(losses).mean();
}

at::Tensor TrainingModule::validation_step(const Batch&, int64_t) {
  throw InvalidArgumentError(
      "this TrainingModule does not implement validation_step");
}

at::Tensor TrainingModule::test_step(const Batch& batch, int64_t batch_idx) {
  return validation_step(batch, batch_idx);
}

at::Tensor TrainingModule::predict_step(const Batch&, int64_t) {
  throw InvalidArgumentError("this TrainingModule does not implement predict_step");
}

}  // namespace strategy
}  // namespace fsdp2
