#include "core/strategy/micro_batch_step.h"

#include <ATen/ATen.h>

#include <numeric>
#include <string>
#include <vector>

#include "core/common/error.h"

namespace fsdp2 {
namespace strategy {

MicroBatchStepResult MicroBatchStep(FSDP2Strategy& strategy, int num_micro_batches,
                                    const std::function<MicroBatch(int)>& micro_batch,
                                    double gradient_clip_val) {
  const int k = num_micro_batches;
  if (k < 1) {
    throw InvalidArgumentError("MicroBatchStep: need at least one micro-batch, got " +
                               std::to_string(k));
  }
  // Per-item weights (TrainingModule::loss_items): micro-batch i's mean
  // loss counts items_i / global items, times the data-parallel size that
  // the gradients' mean over ranks divides by again. Whether the module
  // counts items is a property of the module, the same on every rank, so
  // only counting modules pay for the reduction (and for asking for the
  // micro-batches after the first a second time); the first is kept.
  MicroBatch first = micro_batch(0);
  std::vector<int64_t> items(k, strategy.module().loss_items(first.batch));
  const bool weighted = items[0] >= 0;
  double global_items = 0;
  if (weighted) {
    for (int i = 1; i < k; ++i) items[i] = strategy.module().loss_items(micro_batch(i).batch);
    const int64_t local = std::accumulate(items.begin(), items.end(), int64_t{0});
    global_items = strategy.reduce(at::scalar_tensor(static_cast<double>(local), at::kDouble),
                                   /*mean=*/false)
                       .item<double>();
  }
  const double dp = strategy.data_parallel_size();
  double loss_sum = 0;
  for (int i = 0; i < k; ++i) {
    const MicroBatch micro = i == 0 ? std::move(first) : micro_batch(i);
    at::Tensor loss = strategy.training_step(micro.batch, micro.batch_idx);
    // The last backward knows the clipping to come (cpu_offload steps
    // during it when there is none).
    if (!weighted) {
      strategy.backward(loss / k, /*sync_gradients=*/i == k - 1, gradient_clip_val);
      loss_sum += loss.item<double>();
      continue;
    }
    const double weight = global_items > 0 ? items[i] * dp / global_items : 0.0;
    strategy.backward(loss * weight, /*sync_gradients=*/i == k - 1, gradient_clip_val);
    if (weight != 0) loss_sum += loss.item<double>() * weight;
  }
  MicroBatchStepResult result;
  result.grad_norm = strategy.optimizer_step(gradient_clip_val);
  result.local_loss = weighted ? loss_sum : loss_sum / k;
  return result;
}

std::vector<Batch> SplitRows(const Batch& batch, int k) {
  if (batch.empty()) throw ShapeError("the batch has no tensors");
  if (k < 1) {
    throw InvalidArgumentError("accumulate_grad_batches must be at least 1, got " +
                               std::to_string(k));
  }
  const int64_t rows = batch[0].dim() == 0 ? 0 : batch[0].size(0);
  for (const auto& t : batch) {
    if (t.dim() == 0 || t.size(0) != rows) {
      throw ShapeError("every batch tensor needs the same first dimension (rows)");
    }
  }
  if (rows % k != 0 || rows == 0) {
    throw ShapeError("the batch's " + std::to_string(rows) +
                     " rows do not split into accumulate_grad_batches = " + std::to_string(k) +
                     " equal, non-empty micro-batches");
  }
  std::vector<Batch> micro(k);
  for (int i = 0; i < k; ++i) {
    for (const auto& t : batch) micro[i].push_back(t.narrow(0, i * (rows / k), rows / k));
  }
  return micro;
}

TrainingStepResult TrainingStepOnRows(FSDP2Strategy& strategy, const Batch& batch,
                                      int64_t batch_idx, int accumulate_grad_batches,
                                      double gradient_clip_val) {
  const std::vector<Batch> micro = SplitRows(batch, accumulate_grad_batches);
  const MicroBatchStepResult r = MicroBatchStep(
      strategy, accumulate_grad_batches,
      [&](int i) { return MicroBatch{micro[i], batch_idx}; }, gradient_clip_val);
  TrainingStepResult result;
  result.grad_norm = r.grad_norm;
  result.loss =
      strategy.reduce(at::scalar_tensor(r.local_loss, at::kDouble), /*mean=*/true).item<double>();
  result.step = strategy.current_epoch_step().step;
  return result;
}

}  // namespace strategy
}  // namespace fsdp2
