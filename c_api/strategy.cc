// fsdp2/c_api/strategy.cc
//
// fsdp2_strategy_t's life: create, set up the environment, connect a model,
// parallelize, epochs, barrier, teardown, destroy. The steps are in
// strategy_steps.cc; checkpoints and parameters in strategy_state.cc.
#include <string>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "c_api/internal/handles.h"
#include "c_api/internal/options.h"
#include "core/common/error.h"
#include "core/fsdp/fully_shard.h"
#include "core/strategy/optimizer.h"

using namespace fsdp2::c_api;  // NOLINT: the entry points below are C
using fsdp2::FailedPreconditionError;

namespace {

// The optimizer options, checked by ReadOptimizerOptions, as core's.
fsdp2::strategy::OptimizerOptions ToCoreOptimizerOptions(const fsdp2_optimizer_options_t& o) {
  fsdp2::strategy::OptimizerOptions out;
  switch (o.kind) {
    case FSDP2_OPTIMIZER_ADAMW: out.kind = fsdp2::strategy::OptimizerKind::kAdamW; break;
    case FSDP2_OPTIMIZER_ADAM: out.kind = fsdp2::strategy::OptimizerKind::kAdam; break;
    case FSDP2_OPTIMIZER_SGD: out.kind = fsdp2::strategy::OptimizerKind::kSGD; break;
    default:
      throw fsdp2::InvalidArgumentError("unknown optimizer kind " + std::to_string(o.kind));
  }
  out.lr = o.lr;
  out.beta1 = o.beta1;
  out.beta2 = o.beta2;
  out.eps = o.eps;
  out.weight_decay = o.weight_decay;
  out.momentum = o.momentum;
  return out;
}

}  // namespace

extern "C" {

fsdp2_status_t fsdp2_strategy_create(const fsdp2_strategy_options_t* options,
                                     fsdp2_strategy_t** out) {
  FSDP2_API_BEGIN
  NotNull(out, "out");
  auto state = std::make_shared<StrategyState>();
  state->strategy = std::make_unique<fsdp2::strategy::FSDP2Strategy>(ToStrategyOptions(options));
  *out = NewHandle<fsdp2_strategy_t>(Kind::kStrategy, state);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_create_from_json(const char* options_json,
                                               fsdp2_strategy_t** out) {
  FSDP2_API_BEGIN
  NotNull(out, "out");
  auto state = std::make_shared<StrategyState>();
  state->strategy = std::make_unique<fsdp2::strategy::FSDP2Strategy>(
      StrategyOptionsFromJson(ParseObject(options_json, "strategy options")));
  *out = NewHandle<fsdp2_strategy_t>(Kind::kStrategy, state);
  FSDP2_API_END
}

void fsdp2_strategy_destroy(fsdp2_strategy_t* strategy) {
  if (strategy == nullptr) return;
  auto state =
      std::static_pointer_cast<StrategyState>(RemoveHandle(IdOf(strategy), Kind::kStrategy));
  if (!state) return;
  try {
    state->strategy->teardown();
  } catch (...) {
    // Destroy never fails; the state goes away regardless.
  }
}

fsdp2_status_t fsdp2_strategy_setup_environment(fsdp2_strategy_t* strategy) {
  FSDP2_API_BEGIN
  GetStrategy(strategy)->strategy->setup_environment();
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_rank_info(const fsdp2_strategy_t* strategy, int32_t* rank,
                                        int32_t* world_size, int32_t* data_parallel_rank,
                                        int32_t* data_parallel_size) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  const auto& world = s->strategy->world();
  if (!world) {
    throw FailedPreconditionError(
        "fsdp2_strategy_rank_info: call fsdp2_strategy_setup_environment first");
  }
  const int32_t r = world->rank(), w = world->size();
  const int32_t dr = s->strategy->data_parallel_rank(), dw = s->strategy->data_parallel_size();
  if (rank) *rank = r;
  if (world_size) *world_size = w;
  if (data_parallel_rank) *data_parallel_rank = dr;
  if (data_parallel_size) *data_parallel_size = dw;
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_connect(fsdp2_strategy_t* strategy, fsdp2_model_t* model,
                                      const fsdp2_optimizer_options_t* optimizer) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  auto m = GetModel(model);
  if (s->module) {
    throw FailedPreconditionError(
        "fsdp2_strategy_connect: a model is already connected to this strategy");
  }
  const fsdp2_optimizer_options_t o = ReadOptimizerOptions(optimizer);
  if (fsdp2::fsdp::unit_of(*m->module->module())) {
    throw FailedPreconditionError(
        "fsdp2_strategy_connect: this model is already parallelized by another strategy");
  }
  m->module->set_optimizer_options(ToCoreOptimizerOptions(o));
  s->strategy->connect(m->module);
  s->module = m->module;
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_parallelize(fsdp2_strategy_t* strategy) {
  FSDP2_API_BEGIN
  // A second call warns and does nothing, as the spec says.
  GetStrategy(strategy)->strategy->parallelize();
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_current_epoch_step(const fsdp2_strategy_t* strategy,
                                                 int64_t* epoch, int64_t* step) {
  FSDP2_API_BEGIN
  const auto es = GetStrategy(strategy)->strategy->current_epoch_step();
  if (epoch) *epoch = es.epoch;
  if (step) *step = es.step;
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_set_epoch(fsdp2_strategy_t* strategy, int64_t epoch) {
  FSDP2_API_BEGIN
  Require(epoch >= 0, "epoch must be non-negative");
  GetStrategy(strategy)->strategy->set_epoch(epoch);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_barrier(fsdp2_strategy_t* strategy) {
  FSDP2_API_BEGIN
  GetStrategy(strategy)->strategy->barrier();
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_teardown(fsdp2_strategy_t* strategy) {
  FSDP2_API_BEGIN
  GetStrategy(strategy)->strategy->teardown();
  FSDP2_API_END
}

}  // extern "C"
