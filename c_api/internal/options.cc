#include "c_api/internal/options.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "core/strategy/fsdp_controls.h"

namespace fsdp2 {
namespace c_api {

const char* InternString(const std::string& s) {
  static std::mutex mu;
  static auto* strings = new std::unordered_set<std::string>();  // never freed
  std::lock_guard<std::mutex> lock(mu);
  return strings->insert(s).first->c_str();
}

nlohmann::json ParseObject(const char* json, const char* what) {
  NotNull(json, what);
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(std::string(what) + " is not valid JSON: " + e.what());
  }
  if (!value.is_object()) throw InvalidArgumentError(std::string(what) + " must be a JSON object");
  return value;
}

int32_t JsonSize(const nlohmann::json& v, const std::string& key) {
  if (v.is_string() && v.get<std::string>() == "auto") return 0;
  if (v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() < (1 << 30)) {
    return static_cast<int32_t>(v.get<int64_t>());
  }
  throw InvalidArgumentError("\"" + key + "\" must be \"auto\" or a positive integer, got " +
                             v.dump());
}

int32_t JsonBool(const nlohmann::json& v, const std::string& key) {
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  if (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1)) {
    return static_cast<int32_t>(v.get<int64_t>());
  }
  throw InvalidArgumentError("\"" + key + "\" must be true or false, got " + v.dump());
}

void UnknownKey(const std::string& key, const char* known) {
  throw InvalidArgumentError("unknown option \"" + key + "\" (known: " + known + ")");
}

strategy::FSDP2StrategyOptions ToStrategyOptions(const fsdp2_strategy_options_t* options) {
  fsdp2_strategy_options_t o;
  fsdp2_strategy_options_init(&o);
  if (options != nullptr) CopyGrown(&o, options);
  strategy::FSDP2StrategyOptions out;
  Require(o.data_parallel_size >= 0, "data_parallel_size must be 0 (auto) or positive, got " +
                                         std::to_string(o.data_parallel_size));
  Require(o.tensor_parallel_size >= 0, "tensor_parallel_size must be 0 (auto) or positive, got " +
                                           std::to_string(o.tensor_parallel_size));
  if (o.data_parallel_size > 0) {
    out.data_parallel_size = strategy::ParallelSize::Of(o.data_parallel_size);
  }
  if (o.tensor_parallel_size > 0) {
    out.tensor_parallel_size = strategy::ParallelSize::Of(o.tensor_parallel_size);
  }
  switch (o.sharding_strategy) {
    case FSDP2_FULL_SHARD: out.sharding_strategy = fsdp::ShardingStrategy::kFullShard; break;
    case FSDP2_SHARD_GRAD_OP: out.sharding_strategy = fsdp::ShardingStrategy::kShardGradOp; break;
    case FSDP2_NO_SHARD: out.sharding_strategy = fsdp::ShardingStrategy::kNoShard; break;
    case FSDP2_HYBRID_SHARD: out.sharding_strategy = fsdp::ShardingStrategy::kHybridShard; break;
    default:
      throw InvalidArgumentError("unknown sharding_strategy " +
                                 std::to_string(o.sharding_strategy));
  }
  out.set_reshard_after_forward(o.reshard_after_forward);
  out.shard_group_size = o.shard_group_size;
  switch (o.precision) {
    case FSDP2_PRECISION_FP32: out.mp_policy = fsdp::MixedPrecisionPolicy{}; break;
    case FSDP2_PRECISION_BF16: out.mp_policy = strategy::DefaultMixedPrecision(); break;
    default:
      throw InvalidArgumentError("unknown precision " +
                                 std::to_string(static_cast<int>(o.precision)));
  }
  out.cpu_offload = o.cpu_offload != 0;
  switch (o.backend) {
    case FSDP2_BACKEND_GLOO: out.backend = comm::Backend::kGloo; break;
    case FSDP2_BACKEND_NCCL: out.backend = comm::Backend::kNccl; break;
    default:
      throw InvalidArgumentError("unknown backend " + std::to_string(static_cast<int>(o.backend)));
  }
  switch (o.device) {
    case FSDP2_DEVICE_AUTO: out.device = strategy::DeviceSpec::Auto(); break;
    case FSDP2_DEVICE_CPU: out.device = strategy::DeviceSpec::Cpu(); break;
    case FSDP2_DEVICE_CUDA:
      Require(o.device_index >= -1, "device_index must be -1 (the local rank's GPU) or a GPU "
                                    "number, got " + std::to_string(o.device_index));
      out.device = strategy::DeviceSpec::Cuda(o.device_index);
      break;
    default:
      throw InvalidArgumentError("unknown device " + std::to_string(static_cast<int>(o.device)));
  }
  Require(o.timeout_ms > 0, "timeout_ms must be positive, got " + std::to_string(o.timeout_ms));
  out.timeout = std::chrono::milliseconds(o.timeout_ms);
  switch (o.checkpoint_format) {
    case FSDP2_CHECKPOINT_SHARDED:
      out.checkpoint_format = strategy::CheckpointFormat::kSharded;
      break;
    case FSDP2_CHECKPOINT_FULL: out.checkpoint_format = strategy::CheckpointFormat::kFull; break;
    default:
      throw InvalidArgumentError("unknown checkpoint_format " +
                                 std::to_string(static_cast<int>(o.checkpoint_format)));
  }
  out.seed = o.seed;
  out.data_sampler.seed = o.seed;
  out.data_sampler.shuffle = o.shuffle != 0;
  out.data_sampler.drop_last = o.drop_last != 0;
  Require(o.ac_every >= 1, "ac_every must be at least 1 (checkpoint every k-th block), got " +
                               std::to_string(o.ac_every));
  Require(o.forward_prefetch >= 0 && o.backward_prefetch >= 0,
          "forward_prefetch and backward_prefetch must be 0 or more, got " +
              std::to_string(o.forward_prefetch) + " and " + std::to_string(o.backward_prefetch));
  out.forward_prefetch = o.forward_prefetch;
  out.backward_prefetch = o.backward_prefetch;
  switch (o.gradient_accumulation) {
    case FSDP2_ACCUMULATE_LOCAL:
      out.gradient_accumulation = strategy::GradientAccumulation::kLocal;
      break;
    case FSDP2_ACCUMULATE_SHARDED:
      out.gradient_accumulation = strategy::GradientAccumulation::kSharded;
      break;
    default:
      throw InvalidArgumentError("unknown gradient_accumulation " +
                                 std::to_string(static_cast<int>(o.gradient_accumulation)));
  }
  Require(o.gradient_divide_factor == 0 ||
              (o.gradient_divide_factor > 0 && std::isfinite(o.gradient_divide_factor)),
          "gradient_divide_factor must be 0 (the data-parallel size) or positive, got " +
              std::to_string(o.gradient_divide_factor));
  out.gradient_divide_factor = o.gradient_divide_factor;
  if (o.ignored_params != nullptr) out.ignored_params = strategy::SplitNames(o.ignored_params);
  Require(o.ignored_params_all_reduce == 0 || o.ignored_params_all_reduce == 1,
          "ignored_params_all_reduce must be 0 or 1, got " +
              std::to_string(o.ignored_params_all_reduce));
  out.ignored_params_all_reduce = o.ignored_params_all_reduce == 1;
  if (o.frozen_params != nullptr) out.frozen_params = strategy::SplitNames(o.frozen_params);
  if (o.forward_prefetch_modules != nullptr) {
    out.forward_prefetch_modules =
        strategy::ParsePrefetchModules(o.forward_prefetch_modules, "forward_prefetch_modules");
  }
  if (o.backward_prefetch_modules != nullptr) {
    out.backward_prefetch_modules =
        strategy::ParsePrefetchModules(o.backward_prefetch_modules, "backward_prefetch_modules");
  }
  switch (o.activation_checkpointing) {
    case FSDP2_AC_NONE: break;
    case FSDP2_AC_FULL: out.activation_checkpointing = fsdp::ActivationCheckpointing::Full(); break;
    case FSDP2_AC_SELECTIVE:
      out.activation_checkpointing = fsdp::ActivationCheckpointing::Selective(o.ac_every);
      break;
    default:
      throw InvalidArgumentError("unknown activation_checkpointing " +
                                 std::to_string(static_cast<int>(o.activation_checkpointing)));
  }
  return out;
}

fsdp2_optimizer_options_t ReadOptimizerOptions(const fsdp2_optimizer_options_t* options) {
  fsdp2_optimizer_options_t o;
  fsdp2_optimizer_options_init(&o);
  if (options != nullptr) CopyGrown(&o, options);
  Require(o.kind >= FSDP2_OPTIMIZER_ADAMW && o.kind <= FSDP2_OPTIMIZER_SGD,
          "unknown optimizer kind " + std::to_string(static_cast<int>(o.kind)));
  Require(o.lr > 0 && std::isfinite(o.lr), "optimizer lr must be positive");
  Require(o.eps > 0 && o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1 &&
              o.weight_decay >= 0 && o.momentum >= 0,
          "optimizer options out of range: need eps > 0, 0 <= beta1, beta2 < 1, "
          "weight_decay >= 0, momentum >= 0");
  return o;
}

fsdp2_step_options_t ReadStepOptions(const fsdp2_step_options_t* options) {
  fsdp2_step_options_t o;
  fsdp2_step_options_init(&o);
  if (options != nullptr) CopyGrown(&o, options);
  Require(o.accumulate_grad_batches >= 1, "accumulate_grad_batches must be at least 1, got " +
                                              std::to_string(o.accumulate_grad_batches));
  Require(o.gradient_clip_val >= 0 && std::isfinite(o.gradient_clip_val),
          "gradient_clip_val must be 0 (off) or a positive number");
  return o;
}

std::pair<strategy::TokenDatasetOptions, int64_t> ToTokenDatasetOptions(
    const fsdp2_token_loader_options_t* options) {
  fsdp2_token_loader_options_t o;
  fsdp2_token_loader_options_init(&o);
  if (options != nullptr) CopyGrown(&o, options);
  strategy::TokenDatasetOptions out;
  switch (o.token_dtype) {
    case FSDP2_DTYPE_UINT8: out.token_type = strategy::TokenType::kUInt8; break;
    case FSDP2_DTYPE_UINT16: out.token_type = strategy::TokenType::kUInt16; break;
    case FSDP2_DTYPE_INT32: out.token_type = strategy::TokenType::kInt32; break;
    default: throw InvalidArgumentError("token_dtype must be UINT8, UINT16 or INT32");
  }
  Require(o.block_size >= 1, "block_size must be positive");
  Require(o.global_batch_size >= 1, "global_batch_size must be positive");
  Require(o.begin_fraction >= 0 && o.begin_fraction < o.end_fraction && o.end_fraction <= 1,
          "need 0 <= begin_fraction < end_fraction <= 1");
  out.block_size = o.block_size;
  out.begin_fraction = o.begin_fraction;
  out.end_fraction = o.end_fraction;
  return {out, o.global_batch_size};
}

}  // namespace c_api
}  // namespace fsdp2

// ---------------------------------------------------------------------------
// Defaults: the *_init entry points, here because the readers above start
// from them.

extern "C" {

void fsdp2_strategy_options_init(fsdp2_strategy_options_t* o) {
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->sharding_strategy = FSDP2_FULL_SHARD;
  o->reshard_after_forward = -1;
  o->precision = FSDP2_PRECISION_BF16;
  o->backend = FSDP2_BACKEND_GLOO;
  o->timeout_ms = 5 * 60 * 1000;
  o->checkpoint_format = FSDP2_CHECKPOINT_SHARDED;
  o->shuffle = 1;
  o->drop_last = 1;
  o->activation_checkpointing = FSDP2_AC_NONE;
  o->ac_every = 2;
  o->device = FSDP2_DEVICE_AUTO;
  o->device_index = -1;
  o->forward_prefetch = 1;
  o->backward_prefetch = 1;
  o->gradient_accumulation = FSDP2_ACCUMULATE_LOCAL;
  o->gradient_divide_factor = 0;
  o->ignored_params = nullptr;
  o->ignored_params_all_reduce = 0;
  o->forward_prefetch_modules = nullptr;
  o->backward_prefetch_modules = nullptr;
  o->frozen_params = nullptr;
}

void fsdp2_optimizer_options_init(fsdp2_optimizer_options_t* o) {
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->kind = FSDP2_OPTIMIZER_ADAMW;
  o->lr = 1e-3;
  o->beta1 = 0.9;
  o->beta2 = 0.999;
  o->eps = 1e-8;
  o->weight_decay = 0.01;
  o->momentum = 0;
}

void fsdp2_step_options_init(fsdp2_step_options_t* o) {
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->accumulate_grad_batches = 1;
  o->gradient_clip_val = 0;
}

void fsdp2_token_loader_options_init(fsdp2_token_loader_options_t* o) {
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->token_dtype = FSDP2_DTYPE_UINT8;
  o->block_size = 64;
  o->global_batch_size = 8;
  o->begin_fraction = 0;
  o->end_fraction = 1;
}

}  // extern "C"
