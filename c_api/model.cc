// fsdp2/c_api/model.cc
//
// fsdp2_model_t: built-in model families from JSON
// (core/models/builtin_families.h), deferred (meta) builds under a
// strategy, TorchScript files (core/script/script_family.h).
#include <nlohmann/json.hpp>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "c_api/internal/handles.h"
#include "core/fsdp/fully_shard.h"
#include "core/models/builtin_families.h"
#include "core/script/script_family.h"

using namespace fsdp2::c_api;  // NOLINT: the entry points below are C

extern "C" {

fsdp2_status_t fsdp2_model_create(const char* config_json, fsdp2_model_t** out) {
  FSDP2_API_BEGIN
  NotNull(out, "out");
  NotNull(config_json, "config_json");
  auto state = std::make_shared<ModelState>();
  state->module = fsdp2::models::CreateModelFamily(config_json);
  *out = NewHandle<fsdp2_model_t>(Kind::kModel, state);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_model_create_deferred(fsdp2_strategy_t* strategy, const char* config_json,
                                           fsdp2_model_t** out) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(out, "out");
  NotNull(config_json, "config_json");
  auto state = std::make_shared<ModelState>();
  {
    auto deferred = s->strategy->tensor_init_context();  // until the model is built
    // Each rank will keep its part of the parameters.
    state->module = fsdp2::models::CreateModelFamily(config_json, s->strategy->world()->size());
  }
  *out = NewHandle<fsdp2_model_t>(Kind::kModel, state);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_model_load_torchscript(const char* path, const char* loss,
                                            fsdp2_model_t** out) {
  FSDP2_API_BEGIN
  NotNull(out, "out");
  NotNull(path, "path");
  NotNull(loss, "loss");
  auto state = std::make_shared<ModelState>();
  state->module = fsdp2::script::LoadScriptFamily(path, nlohmann::json{{"loss", loss}}.dump());
  *out = NewHandle<fsdp2_model_t>(Kind::kModel, state);
  FSDP2_API_END_FILE
}

fsdp2_status_t fsdp2_model_load_torchscript_with_options(const char* path,
                                                         const char* options_json,
                                                         fsdp2_model_t** out) {
  FSDP2_API_BEGIN
  NotNull(out, "out");
  NotNull(path, "path");
  NotNull(options_json, "options_json");
  auto state = std::make_shared<ModelState>();
  state->module = fsdp2::script::LoadScriptFamily(path, options_json);
  *out = NewHandle<fsdp2_model_t>(Kind::kModel, state);
  FSDP2_API_END_FILE
}

void fsdp2_model_destroy(fsdp2_model_t* model) {
  if (model != nullptr) RemoveHandle(IdOf(model), Kind::kModel);
}

fsdp2_status_t fsdp2_model_num_parameters(const fsdp2_model_t* model, int64_t* num_tensors,
                                          int64_t* num_elements) {
  FSDP2_API_BEGIN
  auto m = GetModel(model);
  int64_t tensors = 0, elements = 0;
  // Under FSDP the registered parameters are shards: count global sizes.
  for (const auto& info : fsdp2::fsdp::shard_info(*m->module->module(), 0)) {
    int64_t n = 1;
    for (int64_t s : info.global_shape) n *= s;
    ++tensors;
    elements += n;
  }
  if (num_tensors) *num_tensors = tensors;
  if (num_elements) *num_elements = elements;
  FSDP2_API_END
}

}  // extern "C"
