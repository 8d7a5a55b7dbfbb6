// fsdp2/c_api/strategy_steps.cc
//
// The steps of fsdp2_strategy_t: training (with gradient accumulation over
// micro-batches of rows, core/strategy/micro_batch_step.h), validation,
// test and prediction, on caller batches or a data loader's batches.
#include <ATen/ATen.h>

#include <sstream>
#include <string>
#include <vector>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "c_api/internal/handles.h"
#include "c_api/internal/options.h"
#include "c_api/internal/tensors.h"
#include "core/common/error.h"
#include "core/strategy/micro_batch_step.h"

namespace fsdp2 {
namespace c_api {
namespace {

fsdp2_step_result_t TrainingStep(StrategyState& s, const strategy::Batch& batch,
                                 int64_t batch_idx, const fsdp2_step_options_t& o) {
  RequireParallelized(s, "fsdp2_strategy_training_step");
  s.module->CheckBatch(batch);
  const strategy::TrainingStepResult r = strategy::TrainingStepOnRows(
      *s.strategy, batch, batch_idx, o.accumulate_grad_batches, o.gradient_clip_val);
  fsdp2_step_result_t result{};
  result.loss = r.loss;
  result.grad_norm = r.grad_norm;
  result.step = r.step;
  return result;
}

double EvaluationStep(StrategyState& s, const strategy::Batch& batch, int64_t batch_idx,
                      bool test) {
  RequireParallelized(s, test ? "fsdp2_strategy_test_step" : "fsdp2_strategy_validation_step");
  s.module->CheckBatch(batch);
  at::Tensor loss = test ? s.strategy->test_step(batch, batch_idx)
                         : s.strategy->validation_step(batch, batch_idx);
  return loss.item<double>();
}

}  // namespace
}  // namespace c_api
}  // namespace fsdp2

using namespace fsdp2::c_api;  // NOLINT: the entry points below are C

extern "C" {

fsdp2_status_t fsdp2_strategy_training_step(fsdp2_strategy_t* strategy,
                                            const fsdp2_tensor_t* batch, size_t num_tensors,
                                            int64_t batch_idx,
                                            const fsdp2_step_options_t* options,
                                            fsdp2_step_result_t* result) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  const fsdp2_step_options_t o = ReadStepOptions(options);
  const fsdp2_step_result_t r = TrainingStep(*s, BorrowBatch(batch, num_tensors), batch_idx, o);
  if (result) *result = r;
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_validation_step(fsdp2_strategy_t* strategy,
                                              const fsdp2_tensor_t* batch,
                                              size_t num_tensors, int64_t batch_idx,
                                              double* loss) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(loss, "loss");
  *loss = EvaluationStep(*s, BorrowBatch(batch, num_tensors), batch_idx, /*test=*/false);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_test_step(fsdp2_strategy_t* strategy, const fsdp2_tensor_t* batch,
                                        size_t num_tensors, int64_t batch_idx, double* loss) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(loss, "loss");
  *loss = EvaluationStep(*s, BorrowBatch(batch, num_tensors), batch_idx, /*test=*/true);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_predict_shape(fsdp2_strategy_t* strategy,
                                            const fsdp2_tensor_t* batch, size_t num_tensors,
                                            fsdp2_tensor_t* output) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(output, "output");
  RequireParallelized(*s, "fsdp2_strategy_predict_shape");
  const std::vector<int64_t> shape = s->module->PredictShape(BorrowBatch(batch, num_tensors));
  DescribeInto(shape, FSDP2_DTYPE_FLOAT32, output, "the prediction");
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_predict_step(fsdp2_strategy_t* strategy,
                                           const fsdp2_tensor_t* batch, size_t num_tensors,
                                           int64_t batch_idx, fsdp2_tensor_t* output) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(output, "output");
  RequireParallelized(*s, "fsdp2_strategy_predict_step");
  const fsdp2::strategy::Batch b = BorrowBatch(batch, num_tensors);
  // Check the buffer before the (collective) forward would run.
  const std::vector<int64_t> shape = s->module->PredictShape(b);
  if (output->dtype != FSDP2_DTYPE_FLOAT32 || ShapeOf(*output, "output") != shape) {
    std::ostringstream m;
    m << "fsdp2_strategy_predict_step: the output buffer is " << Describe(*output)
      << ", the prediction is " << at::IntArrayRef(shape) << " float32 (dtype "
      << FSDP2_DTYPE_FLOAT32 << ")";
    throw fsdp2::ShapeError(m.str());
  }
  at::Tensor prediction = s->strategy->predict_step(b, batch_idx).to(at::kFloat);
  CopyOut(prediction, output, "output");
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_training_step_loader(fsdp2_strategy_t* strategy,
                                                   fsdp2_dataloader_t* loader,
                                                   int64_t batch_idx,
                                                   const fsdp2_step_options_t* options,
                                                   fsdp2_step_result_t* result) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  auto l = GetLoader(loader);
  const fsdp2_step_options_t o = ReadStepOptions(options);
  const fsdp2_step_result_t r = TrainingStep(*s, l->loader->batch(batch_idx), batch_idx, o);
  if (result) *result = r;
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_validation_step_loader(fsdp2_strategy_t* strategy,
                                                     fsdp2_dataloader_t* loader,
                                                     int64_t batch_idx, double* loss) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  auto l = GetLoader(loader);
  NotNull(loss, "loss");
  *loss = EvaluationStep(*s, l->loader->batch(batch_idx), batch_idx, /*test=*/false);
  FSDP2_API_END
}

}  // extern "C"
