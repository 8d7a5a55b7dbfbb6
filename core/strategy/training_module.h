// fsdp2/core/strategy/training_module.h
//
// What a user hands to FSDP2Strategy: the LightningModule role. A
// TrainingModule owns a torch::nn::Module, says how one step turns a batch
// into a loss or an output, and builds its optimizer. The strategy calls
// these methods under FSDP (after parallelize()), so a step sees sharded
// parameters and must run the model through fsdp::forward.
#ifndef FSDP2_CORE_STRATEGY_TRAINING_MODULE_H_
#define FSDP2_CORE_STRATEGY_TRAINING_MODULE_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

namespace fsdp2 {
namespace strategy {

// A batch: the tensors a step needs (e.g. {inputs, targets}), this rank's rows.
using Batch = std::vector<at::Tensor>;

// Which step the strategy runs: selects the module's *_step method and its
// loss_reduction().
enum class StepType { kTraining, kValidation, kTest, kPredict };
// "training", "validation", "test" or "predict" (static storage).
const char* ToString(StepType step);

// Turns a step's output into the loss, and combines losses for reporting
// (NeMo's MegatronLossReduction role). Found through
// TrainingModule::loss_reduction().
class LossReduction {
 public:
  virtual ~LossReduction() = default;
  // The loss of one batch, given what the step returned.
  virtual at::Tensor forward(const Batch& batch, const at::Tensor& output) = 0;
  // Combines the losses of several batches (default: their mean).
  virtual at::Tensor reduce(const std::vector<at::Tensor>& losses);
};

// The user's model and step logic (the LightningModule role; see the file
// comment). The strategy holds it by shared_ptr and calls it from one thread.
class TrainingModule {
 public:
  virtual ~TrainingModule() = default;

  // The model. The strategy shards it in place in parallelize().
  virtual std::shared_ptr<torch::nn::Module> module() = 0;

  // Each returns the loss of `batch` (a scalar), or, when loss_reduction()
  // gives a reduction for that step, whatever that reduction consumes.
  virtual at::Tensor training_step(const Batch& batch, int64_t batch_idx) = 0;
  // As training_step, run without gradients. The default throws
  // InvalidArgumentError (the module has no validation step).
  virtual at::Tensor validation_step(const Batch& batch, int64_t batch_idx);
  // As validation_step; the default calls validation_step.
  virtual at::Tensor test_step(const Batch& batch, int64_t batch_idx);
  // The prediction for this rank's rows.
  virtual at::Tensor predict_step(const Batch& batch, int64_t batch_idx);

  // Called after parallelize(): the optimizer over module()->parameters(),
  // which are local shards by then.
  virtual std::unique_ptr<torch::optim::Optimizer> configure_optimizers() = 0;

  // How many items the loss of `batch` averages over (for a language model:
  // its targets other than the ignore index -100), or -1 (the default) for
  // a loss that is not such a mean. When every micro-batch of a step gives a
  // count, the step's loss is the mean over the items of the whole global
  // batch, across micro-batches and data-parallel ranks (transformers'
  // num_items_in_batch), not the mean of per-micro-batch means: each
  // micro-batch's loss is weighted by its share of the global count.
  virtual int64_t loss_items(const Batch& batch) { return -1; }

  // The loss reduction for `step` (the spec's training_loss_reduction,
  // validation_loss_reduction, ...), or nullptr: the step returns its loss.
  virtual std::shared_ptr<LossReduction> loss_reduction(StepType step) {
    return nullptr;
  }
};

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_TRAINING_MODULE_H_
