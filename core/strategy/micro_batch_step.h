// fsdp2/core/strategy/micro_batch_step.h
//
// One optimizer step over k micro-batches (gradient accumulation), the step
// Trainer::fit takes and the C ABI's fsdp2_strategy_training_step takes:
//
//   for i in 0..k-1:  loss_i = strategy.training_step(micro_batch i)
//                     strategy.backward(loss_i / k, sync_gradients = i == k-1)
//   grad_norm = strategy.optimizer_step(gradient_clip_val)
//
// so the gradient is that of the mean loss over the micro-batches and is
// communicated once, on the last. When the module counts its loss items
// (TrainingModule::loss_items, e.g. targets that are not -100), the
// micro-batches are weighted by their share of the global batch's items
// instead of 1/k: the gradient of the mean over every item of every rank.
// Collective: every rank calls it with the same k.
#ifndef FSDP2_CORE_STRATEGY_MICRO_BATCH_STEP_H_
#define FSDP2_CORE_STRATEGY_MICRO_BATCH_STEP_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "core/strategy/fsdp2_strategy.h"

namespace fsdp2 {
namespace strategy {

// A micro-batch and the batch index its training_step receives.
struct MicroBatch {
  Batch batch;  // the tensors training_step gets, on the host or the device
  int64_t batch_idx = 0;  // passed through to training_step; default 0
};

// What MicroBatchStep reports; the loss is this rank's only.
struct MicroBatchStepResult {
  // This rank's loss, not reduced: the mean of its micro-batch losses, or,
  // when the module counts loss items (TrainingModule::loss_items), its
  // items' share of the global loss times the data-parallel size, so that
  // the mean over ranks is the loss over every item of the global batch.
  double local_loss = 0;
  double grad_norm = 0;   // as optimizer_step returns it
};

// Takes one optimizer step over `num_micro_batches` micro-batches, asking
// `micro_batch(i)` for each when it is needed (so only one is held at a
// time; a module that counts loss items has micro-batches 1..k-1 asked for
// twice, once to count them before the first backward). Throws
// InvalidArgumentError when num_micro_batches < 1.
MicroBatchStepResult MicroBatchStep(FSDP2Strategy& strategy, int num_micro_batches,
                                    const std::function<MicroBatch(int)>& micro_batch,
                                    double gradient_clip_val = 0);

// `batch` (tensors with a common first dimension, the rows) cut into k equal
// micro-batches of rows, as views. Throws ShapeError when a tensor is 0-d,
// the first dimensions differ, or the rows do not split into k equal,
// non-empty parts.
std::vector<Batch> SplitRows(const Batch& batch, int k);

// What TrainingStepOnRows reports: the same on every rank.
struct TrainingStepResult {
  double loss = 0;       // mean over micro-batches and data-parallel ranks
  double grad_norm = 0;  // before clipping (0 when not clipping)
  int64_t step = 0;      // optimizer steps taken, this one included
};

// One optimizer step on `batch` split into `accumulate_grad_batches`
// micro-batches of rows (SplitRows), every micro-batch with `batch_idx`;
// the loss is reduced over the data-parallel ranks.
TrainingStepResult TrainingStepOnRows(FSDP2Strategy& strategy, const Batch& batch,
                                      int64_t batch_idx, int accumulate_grad_batches,
                                      double gradient_clip_val = 0);

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_MICRO_BATCH_STEP_H_
