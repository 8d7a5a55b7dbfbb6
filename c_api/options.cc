// fsdp2/c_api/options.cc
//
// The option structs' JSON readers (*_from_json). A new option gets its
// JSON key here, and its default and conversion in internal/options.cc (see
// c_api/README.md).
#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "c_api/internal/options.h"

using namespace fsdp2::c_api;  // NOLINT: the entry points below are C

namespace {

// A name in an option's list text: no separator of that text inside it.
std::string ListItem(const nlohmann::json& v, const std::string& key, const char* separators) {
  if (!v.is_string()) {
    throw fsdp2::InvalidArgumentError("\"" + key + "\" must hold strings, got " + v.dump());
  }
  const std::string item = v.get<std::string>();
  if (item.find_first_of(separators) != std::string::npos) {
    throw fsdp2::InvalidArgumentError("\"" + key + "\": '" + item + "' contains one of \"" +
                                      separators + "\"");
  }
  return item;
}

// "ignored_params": a comma-separated string or a list of names/patterns,
// as the struct's text; null: none.
const char* JsonNameList(const nlohmann::json& v, const std::string& key) {
  if (v.is_null()) return nullptr;
  if (v.is_string()) return InternString(v.get<std::string>());
  if (!v.is_array()) {
    throw fsdp2::InvalidArgumentError("\"" + key + "\" must be a string or a list of strings, got " +
                                      v.dump());
  }
  std::string text;
  for (const auto& item : v) text += (text.empty() ? "" : ",") + ListItem(item, key, ",");
  return InternString(text);
}

// "*_prefetch_modules": the struct's "unit:a,b;unit:c" text, or an object
// {"unit": ["a", "b"]} written as that text; null: none.
const char* JsonPrefetchModules(const nlohmann::json& v, const std::string& key) {
  if (v.is_null()) return nullptr;
  if (v.is_string()) return InternString(v.get<std::string>());
  if (!v.is_object()) {
    throw fsdp2::InvalidArgumentError("\"" + key + "\" must be a string or an object of lists, got " +
                                      v.dump());
  }
  std::string text;
  for (const auto& [unit, listed] : v.items()) {
    if (!listed.is_array()) {
      throw fsdp2::InvalidArgumentError("\"" + key + "\": the list of '" + unit +
                                        "' must be a list of module names, got " + listed.dump());
    }
    text += (text.empty() ? "" : ";") + ListItem(unit, key, ":;,") + ":";
    bool first = true;
    for (const auto& item : listed) {
      text += (first ? "" : ",") + ListItem(item, key, ":;,");
      first = false;
    }
  }
  return InternString(text);
}

}  // namespace

extern "C" {

fsdp2_status_t fsdp2_strategy_options_from_json(const char* json,
                                                fsdp2_strategy_options_t* options) {
  FSDP2_API_BEGIN
  NotNull(options, "options");
  const nlohmann::json config = ParseObject(json, "strategy options");
  fsdp2_strategy_options_t o;
  fsdp2_strategy_options_init(&o);
  CopyGrown(&o, options);
  const char* known =
      "data_parallel_size, tensor_parallel_size, sharding_strategy, "
      "reshard_after_forward, shard_group_size, precision, cpu_offload, backend, "
      "timeout_ms, checkpoint_format, seed, shuffle, drop_last, "
      "activation_checkpointing, ac_every, device, forward_prefetch, backward_prefetch, "
      "gradient_accumulation, gradient_divide_factor, ignored_params, "
      "ignored_params_all_reduce, forward_prefetch_modules, backward_prefetch_modules, "
      "frozen_params";
  for (const auto& [key, v] : config.items()) {
    if (key == "data_parallel_size") {
      o.data_parallel_size = JsonSize(v, key);
    } else if (key == "tensor_parallel_size") {
      o.tensor_parallel_size = JsonSize(v, key);
    } else if (key == "sharding_strategy") {
      o.sharding_strategy = JsonEnum<int32_t>(
          v, key, {{"full_shard", FSDP2_FULL_SHARD}, {"shard_grad_op", FSDP2_SHARD_GRAD_OP},
                   {"no_shard", FSDP2_NO_SHARD}, {"hybrid_shard", FSDP2_HYBRID_SHARD}});
    } else if (key == "reshard_after_forward") {
      o.reshard_after_forward =
          v.is_null() ? -1 : v.is_number_integer() ? JsonNumber<int32_t>(v, key) : JsonBool(v, key);
    } else if (key == "shard_group_size") {
      o.shard_group_size = JsonNumber<int32_t>(v, key);
    } else if (key == "precision") {
      o.precision = JsonEnum<int32_t>(
          v, key, {{"fp32", FSDP2_PRECISION_FP32}, {"bf16", FSDP2_PRECISION_BF16}});
    } else if (key == "cpu_offload") {
      o.cpu_offload = JsonBool(v, key);
    } else if (key == "backend") {
      o.backend = JsonEnum<int32_t>(
          v, key, {{"gloo", FSDP2_BACKEND_GLOO}, {"nccl", FSDP2_BACKEND_NCCL}});
    } else if (key == "timeout_ms") {
      o.timeout_ms = JsonNumber<int64_t>(v, key);
    } else if (key == "checkpoint_format") {
      o.checkpoint_format = JsonEnum<int32_t>(
          v, key, {{"sharded", FSDP2_CHECKPOINT_SHARDED}, {"full", FSDP2_CHECKPOINT_FULL}});
    } else if (key == "seed") {
      o.seed = JsonNumber<uint64_t>(v, key);
    } else if (key == "shuffle") {
      o.shuffle = JsonBool(v, key);
    } else if (key == "drop_last") {
      o.drop_last = JsonBool(v, key);
    } else if (key == "activation_checkpointing") {
      o.activation_checkpointing =
          v.is_boolean() ? (v.get<bool>() ? FSDP2_AC_FULL : FSDP2_AC_NONE)
                         : JsonEnum<int32_t>(v, key, {{"none", FSDP2_AC_NONE},
                                                      {"full", FSDP2_AC_FULL},
                                                      {"selective", FSDP2_AC_SELECTIVE}});
    } else if (key == "ac_every") {
      o.ac_every = JsonNumber<int32_t>(v, key);
    } else if (key == "forward_prefetch") {
      o.forward_prefetch = JsonNumber<int32_t>(v, key);
    } else if (key == "backward_prefetch") {
      o.backward_prefetch = JsonNumber<int32_t>(v, key);
    } else if (key == "gradient_accumulation") {
      o.gradient_accumulation = JsonEnum<int32_t>(
          v, key, {{"local", FSDP2_ACCUMULATE_LOCAL}, {"sharded", FSDP2_ACCUMULATE_SHARDED}});
    } else if (key == "gradient_divide_factor") {
      o.gradient_divide_factor = JsonNumber<double>(v, key);
    } else if (key == "ignored_params") {
      o.ignored_params = JsonNameList(v, key);
    } else if (key == "frozen_params") {
      o.frozen_params = JsonNameList(v, key);
    } else if (key == "ignored_params_all_reduce") {
      o.ignored_params_all_reduce = JsonBool(v, key);
    } else if (key == "forward_prefetch_modules") {
      o.forward_prefetch_modules = JsonPrefetchModules(v, key);
    } else if (key == "backward_prefetch_modules") {
      o.backward_prefetch_modules = JsonPrefetchModules(v, key);
    } else if (key == "device") {
      // "auto", "cpu", "cuda" (the local rank's GPU) or "cuda:K".
      const std::string d = v.is_string() ? v.get<std::string>() : "";
      int index = -1;
      bool ok = d == "auto" || d == "cpu" || d == "cuda";
      if (d.rfind("cuda:", 0) == 0 && d.size() > 5 &&
          d.find_first_not_of("0123456789", 5) == std::string::npos && d.size() < 10) {
        index = std::stoi(d.substr(5));
        ok = true;
      }
      if (!ok) {
        throw fsdp2::InvalidArgumentError("device must be \"auto\", \"cpu\", \"cuda\" or "
                                   "\"cuda:K\", got " + v.dump());
      }
      o.device = d == "auto" ? FSDP2_DEVICE_AUTO : d == "cpu" ? FSDP2_DEVICE_CPU : FSDP2_DEVICE_CUDA;
      o.device_index = index;
    } else {
      UnknownKey(key, known);
    }
  }
  CopyBack(o, options);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_optimizer_options_from_json(const char* json,
                                                 fsdp2_optimizer_options_t* options) {
  FSDP2_API_BEGIN
  NotNull(options, "options");
  const nlohmann::json config = ParseObject(json, "optimizer options");
  fsdp2_optimizer_options_t o;
  fsdp2_optimizer_options_init(&o);
  CopyGrown(&o, options);
  for (const auto& [key, v] : config.items()) {
    if (key == "kind") {
      o.kind = JsonEnum<int32_t>(
          v, key, {{"adamw", FSDP2_OPTIMIZER_ADAMW}, {"adam", FSDP2_OPTIMIZER_ADAM},
                   {"sgd", FSDP2_OPTIMIZER_SGD}});
    } else if (key == "lr") {
      o.lr = JsonNumber<double>(v, key);
    } else if (key == "beta1") {
      o.beta1 = JsonNumber<double>(v, key);
    } else if (key == "beta2") {
      o.beta2 = JsonNumber<double>(v, key);
    } else if (key == "eps") {
      o.eps = JsonNumber<double>(v, key);
    } else if (key == "weight_decay") {
      o.weight_decay = JsonNumber<double>(v, key);
    } else if (key == "momentum") {
      o.momentum = JsonNumber<double>(v, key);
    } else {
      UnknownKey(key, "kind, lr, beta1, beta2, eps, weight_decay, momentum");
    }
  }
  CopyBack(o, options);
  FSDP2_API_END
}

}  // extern "C"
