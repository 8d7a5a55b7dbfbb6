// fsdp2/c_api/strategy_state.cc
//
// What fsdp2_strategy_t holds: checkpoints, the optimizer's state, and the
// model's parameters by name (full tensors gathered from their shards).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "c_api/internal/handles.h"
#include "c_api/internal/tensors.h"
#include "core/checkpoint/hf_checkpoint.h"
#include "core/common/error.h"
#include "core/fsdp/fully_shard.h"
#include "core/tp/state_dict.h"

namespace fsdp2 {
namespace c_api {
namespace {

using ParameterInfo = strategy::FSDP2Strategy::ParameterInfo;

// The parameter named `name` (InvalidArgumentError if there is none).
const ParameterInfo& FindParameter(const StrategyState& s, const char* name) {
  NotNull(name, "name");
  for (const auto& info : s.strategy->parameter_infos()) {
    if (info.name == name) return info;
  }
  throw InvalidArgumentError(std::string("the model has no parameter named '") + name +
                             "' (see fsdp2_strategy_parameter_info)");
}

}  // namespace
}  // namespace c_api
}  // namespace fsdp2

using namespace fsdp2::c_api;  // NOLINT: the entry points below are C

extern "C" {

fsdp2_status_t fsdp2_strategy_save_checkpoint(fsdp2_strategy_t* strategy, const char* path) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(path, "path");
  RequireParallelized(*s, "fsdp2_strategy_save_checkpoint");
  s->strategy->save_checkpoint(path);
  FSDP2_API_END_FILE
}

fsdp2_status_t fsdp2_strategy_save_checkpoint_ex(fsdp2_strategy_t* strategy, const char* path,
                                                 uint32_t flags) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(path, "path");
  if ((flags & ~uint32_t{FSDP2_SAVE_ASYNC}) != 0) {
    throw fsdp2::InvalidArgumentError("fsdp2_strategy_save_checkpoint_ex: unknown flags " +
                                      std::to_string(flags & ~uint32_t{FSDP2_SAVE_ASYNC}));
  }
  RequireParallelized(*s, "fsdp2_strategy_save_checkpoint_ex");
  s->strategy->save_checkpoint(path, (flags & FSDP2_SAVE_ASYNC) != 0);
  FSDP2_API_END_FILE
}

fsdp2_status_t fsdp2_strategy_wait_for_checkpoint(fsdp2_strategy_t* strategy) {
  FSDP2_API_BEGIN
  GetStrategy(strategy)->strategy->wait_for_checkpoint();
  FSDP2_API_END_FILE
}

fsdp2_status_t fsdp2_strategy_checkpoint_in_flight(const fsdp2_strategy_t* strategy,
                                                   int32_t* in_flight) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(in_flight, "in_flight");
  *in_flight = s->strategy->checkpoint_in_flight() ? 1 : 0;
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_load_checkpoint(fsdp2_strategy_t* strategy, const char* path) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(path, "path");
  RequireParallelized(*s, "fsdp2_strategy_load_checkpoint");
  s->strategy->load_checkpoint(path);
  FSDP2_API_END_FILE
}

fsdp2_status_t fsdp2_strategy_remove_checkpoint(fsdp2_strategy_t* strategy, const char* path) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(path, "path");
  s->strategy->remove_checkpoint(path);
  FSDP2_API_END_FILE
}

fsdp2_status_t fsdp2_strategy_load_model_state_dict_file(fsdp2_strategy_t* strategy,
                                                         const char* path) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(path, "path");
  RequireParallelized(*s, "fsdp2_strategy_load_model_state_dict_file");
  s->strategy->load_model_state_dict(std::string(path));
  FSDP2_API_END_FILE
}

fsdp2_status_t fsdp2_strategy_save_hf_checkpoint(fsdp2_strategy_t* strategy, const char* dir,
                                                 const char* options_json) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(dir, "dir");
  RequireParallelized(*s, "fsdp2_strategy_save_hf_checkpoint");
  int64_t max_shard_bytes = fsdp2::checkpoint::HfSaveOptions{}.max_shard_bytes;
  std::optional<at::ScalarType> dtype;
  bool merged = false;
  if (options_json != nullptr && *options_json != '\0') {
    nlohmann::json o;
    try {
      o = nlohmann::json::parse(options_json);
    } catch (const nlohmann::json::exception& e) {
      throw fsdp2::InvalidArgumentError(std::string("save options are not valid JSON: ") + e.what());
    }
    if (!o.is_object()) throw fsdp2::InvalidArgumentError("save options must be a JSON object");
    for (const auto& [key, v] : o.items()) {
      if (key == "max_shard_size" && v.is_string()) {
        max_shard_bytes = fsdp2::checkpoint::ParseShardSize(v.get<std::string>());
      } else if (key == "max_shard_size" && v.is_number_integer() && v.get<int64_t>() > 0) {
        max_shard_bytes = v.get<int64_t>();
      } else if (key == "dtype" && v.is_string()) {
        dtype = fsdp2::c_api::FloatTypeOfName(v.get<std::string>());
      } else if (key == "merged" && v.is_boolean()) {
        merged = v.get<bool>();
      } else {
        throw fsdp2::InvalidArgumentError("save option \"" + key + "\" = " + v.dump() +
                                   ": known are \"max_shard_size\" (\"5GB\", bytes), "
                                   "\"dtype\" (\"float32\", \"bfloat16\", \"float16\", "
                                   "\"float64\") and \"merged\" (true: LoRA adapters merged "
                                   "into the weights)");
      }
    }
  }
  if (merged) {
    s->strategy->save_hf_merged_checkpoint(dir, max_shard_bytes, dtype);
  } else {
    s->strategy->save_hf_checkpoint(dir, max_shard_bytes, dtype);
  }
  FSDP2_API_END_FILE
}

fsdp2_status_t fsdp2_strategy_optimizer_state_dict(fsdp2_strategy_t* strategy, void** data,
                                                   size_t* size) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(data, "data");
  NotNull(size, "size");
  RequireParallelized(*s, "fsdp2_strategy_optimizer_state_dict");
  const std::string state = s->strategy->optimizer_state_dict();
  void* buffer = std::malloc(state.empty() ? 1 : state.size());
  if (buffer == nullptr) throw std::bad_alloc();
  std::memcpy(buffer, state.data(), state.size());
  *data = buffer;
  *size = state.size();
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_load_optimizer_state_dict(fsdp2_strategy_t* strategy,
                                                        const void* data, size_t size) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  Require(data != nullptr && size > 0, "the optimizer state is empty (data NULL or size 0)");
  s->strategy->load_optimizer_state_dict(std::string(static_cast<const char*>(data), size));
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_has_pending_optimizer_state(const fsdp2_strategy_t* strategy,
                                                          int32_t* pending) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(pending, "pending");
  *pending = s->strategy->has_pending_optimizer_state() ? 1 : 0;
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_num_parameters(const fsdp2_strategy_t* strategy, int64_t* count) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(count, "count");
  RequireParallelized(*s, "fsdp2_strategy_num_parameters");
  *count = static_cast<int64_t>(s->strategy->parameter_infos().size());
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_parameter_info(const fsdp2_strategy_t* strategy, int64_t index,
                                             const char** name, fsdp2_tensor_t* info) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  RequireParallelized(*s, "fsdp2_strategy_parameter_info");
  const auto& infos = s->strategy->parameter_infos();
  const int64_t n = static_cast<int64_t>(infos.size());
  Require(index >= 0 && index < n, "parameter index " + std::to_string(index) +
                                       " is outside 0.." + std::to_string(n - 1));
  const ParameterInfo& p = infos[index];
  if (p.shape.size() > FSDP2_MAX_DIMS) {
    throw fsdp2::ShapeError("the parameter has too many dimensions");
  }
  if (name) *name = p.name.c_str();
  if (info) {
    info->data = nullptr;
    DescribeInto(p.shape, FromScalarType(p.dtype), info, "the parameter");
  }
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_get_parameter(fsdp2_strategy_t* strategy, const char* name,
                                            fsdp2_tensor_t* value) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  RequireParallelized(*s, "fsdp2_strategy_get_parameter");
  const ParameterInfo& p = FindParameter(*s, name);
  NotNull(value, "value");
  // Check the buffer on every rank before the collective gather.
  if (value->dtype != FromScalarType(p.dtype) || ShapeOf(*value, "value") != p.shape) {
    std::ostringstream m;
    m << "fsdp2_strategy_get_parameter('" << name << "'): the buffer is " << Describe(*value)
      << ", the parameter is " << at::IntArrayRef(p.shape) << " dtype "
      << FromScalarType(p.dtype);
    throw fsdp2::ShapeError(m.str());
  }
  const int rank = s->strategy->world()->rank();
  torch::nn::Module& root = *s->module->module();
  for (const auto& info : fsdp2::fsdp::shard_info(root, rank)) {
    if (info.name != name) continue;
    // Undo the data-parallel rows, then the tensor-parallel blocks.
    fsdp2::tp::NamedTensors one{{info.name, fsdp2::fsdp::gather_rows(info, info.shard)}};
    fsdp2::tp::gather_tensor_parallel(root, one);
    CopyOut(one[0].second, value, "value");
    return FSDP2_OK;
  }
  throw fsdp2::InternalError(std::string("parameter '") + name + "' vanished from the model");
  FSDP2_API_END
}

fsdp2_status_t fsdp2_strategy_set_parameter(fsdp2_strategy_t* strategy, const char* name,
                                            const fsdp2_tensor_t* value) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  RequireParallelized(*s, "fsdp2_strategy_set_parameter");
  const ParameterInfo& p = FindParameter(*s, name);
  NotNull(value, "value");
  at::Tensor full = Borrow(*value, "value");
  if (full.scalar_type() != p.dtype || !full.sizes().equals(p.shape)) {
    std::ostringstream m;
    m << "fsdp2_strategy_set_parameter('" << name << "'): the value is " << Describe(*value)
      << ", the parameter is " << at::IntArrayRef(p.shape) << " dtype "
      << FromScalarType(p.dtype);
    throw fsdp2::ShapeError(m.str());
  }
  s->strategy->load_model_state_dict({{name, full}}, /*strict=*/false);
  FSDP2_API_END
}

}  // extern "C"
