#include "c_api/internal/options.h"

#include <cstring>
#include <mutex>
#include <unordered_set>
#include <vector>

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

namespace {

using nlohmann::json;

// Field bindings by type. Integer fields are read as they are, so that a
// value out of its option's range reaches the row's check.
template <typename S, typename F>
OptionField<S> Number(F S::*member) {
  return {[member](const S& o) { return json(o.*member); },
          [member](S& o, const json& v) { o.*member = v.get<F>(); }};
}

// 0 or 1 in an int32_t.
template <typename S>
OptionField<S> Bool(int32_t S::*member) {
  return {[member](const S& o) { return json(o.*member); },
          [member](S& o, const json& v) { o.*member = v.get<bool>() ? 1 : 0; }};
}

// "auto" as 0.
template <typename S>
OptionField<S> Size(int32_t S::*member) {
  return {[member](const S& o) { return o.*member == 0 ? json("auto") : json(o.*member); },
          [member](S& o, const json& v) { o.*member = v.is_string() ? 0 : v.get<int32_t>(); }};
}

// A C enumeration whose codes are the positions of its row's choices.
template <typename S, typename Target>
OptionField<S> Choice(int32_t S::*member, const strategy::OptionTable<Target>& table,
                      const std::string& name) {
  const std::vector<std::string> choices = strategy::FindOption(table, name)->choices;
  return {[member, choices, name](const S& o) {
            const int32_t code = o.*member;
            if (code < 0 || code >= static_cast<int32_t>(choices.size())) {
              throw InvalidArgumentError("unknown " + name + " " + std::to_string(code));
            }
            return json(choices[static_cast<size_t>(code)]);
          },
          [member, choices](S& o, const json& v) {
            o.*member = static_cast<int32_t>(
                std::find(choices.begin(), choices.end(), v.get<std::string>()) - choices.begin());
          }};
}

// A string the library keeps (InternString); NULL and "" are none.
template <typename S>
OptionField<S> Text(const char* S::*member) {
  return {[member](const S& o) {
            const char* text = o.*member;
            return text == nullptr || *text == '\0' ? json() : json(text);
          },
          [member](S& o, const json& v) {
            const bool none = !v.is_string() || v.get<std::string>().empty();
            o.*member = none ? nullptr : InternString(v.get<std::string>());
          }};
}

// device and device_index together: "auto", "cpu", "cuda", "cuda:K".
OptionField<fsdp2_strategy_options_t> Device() {
  using S = fsdp2_strategy_options_t;
  return {[](const S& o) -> json {
            switch (o.device) {
              case FSDP2_DEVICE_AUTO: return "auto";
              case FSDP2_DEVICE_CPU: return "cpu";
              case FSDP2_DEVICE_CUDA:
                Require(o.device_index >= -1, "device_index must be -1 (the local rank's GPU) "
                                              "or a GPU number, got " +
                                                  std::to_string(o.device_index));
                return strategy::DeviceSpec::Cuda(o.device_index).ToString();
              default:
                throw InvalidArgumentError("unknown device " +
                                           std::to_string(static_cast<int>(o.device)));
            }
          },
          [](S& o, const json& v) {
            const strategy::DeviceSpec d = strategy::DeviceSpec::Parse(v.get<std::string>());
            o.device = d.kind == strategy::DeviceKind::kAuto  ? FSDP2_DEVICE_AUTO
                       : d.kind == strategy::DeviceKind::kCpu ? FSDP2_DEVICE_CPU
                                                              : FSDP2_DEVICE_CUDA;
            o.device_index = d.index;
          }};
}

}  // namespace

const OptionFields<fsdp2_strategy_options_t>& StrategyOptionFields() {
  using S = fsdp2_strategy_options_t;
  const auto& t = strategy::StrategyOptionTable();
  static const auto* fields = new OptionFields<S>{
      {"data_parallel_size", Size(&S::data_parallel_size)},
      {"tensor_parallel_size", Size(&S::tensor_parallel_size)},
      {"shuffle", Bool(&S::shuffle)},
      {"drop_last", Bool(&S::drop_last)},
      {"precision", Choice(&S::precision, t, "precision")},
      {"sharding_strategy", Choice(&S::sharding_strategy, t, "sharding_strategy")},
      {"reshard_after_forward", Number(&S::reshard_after_forward)},
      {"shard_group_size", Number(&S::shard_group_size)},
      {"cpu_offload", Bool(&S::cpu_offload)},
      {"device", Device()},
      {"backend", Choice(&S::backend, t, "backend")},
      {"timeout_ms", Number(&S::timeout_ms)},
      {"checkpoint_format", Choice(&S::checkpoint_format, t, "checkpoint_format")},
      {"seed", Number(&S::seed)},
      {"activation_checkpointing",
       Choice(&S::activation_checkpointing, t, "activation_checkpointing")},
      {"ac_every", Number(&S::ac_every)},
      {"forward_prefetch", Number(&S::forward_prefetch)},
      {"backward_prefetch", Number(&S::backward_prefetch)},
      {"gradient_divide_factor", Number(&S::gradient_divide_factor)},
      {"gradient_accumulation", Choice(&S::gradient_accumulation, t, "gradient_accumulation")},
      {"forward_prefetch_modules", Text(&S::forward_prefetch_modules)},
      {"backward_prefetch_modules", Text(&S::backward_prefetch_modules)},
      {"ignored_params", Text(&S::ignored_params)},
      {"ignored_params_all_reduce", Bool(&S::ignored_params_all_reduce)},
      {"frozen_params", Text(&S::frozen_params)},
      {"pin_memory", Bool(&S::pin_memory)},
      {"gpu_memory_limit_gib", Number(&S::gpu_memory_limit_gib)},
      {"profile_steps", Number(&S::profile_steps)},
      {"profile_wait_steps", Number(&S::profile_wait_steps)},
      {"profile_path", Text(&S::profile_path)},
  };
  return *fields;
}

const OptionFields<fsdp2_optimizer_options_t>& OptimizerOptionFields() {
  using S = fsdp2_optimizer_options_t;
  static const auto* fields = new OptionFields<S>{
      {"kind", Choice(&S::kind, strategy::OptimizerOptionTable(), "kind")},
      {"lr", Number(&S::lr)},
      {"beta1", Number(&S::beta1)},
      {"beta2", Number(&S::beta2)},
      {"eps", Number(&S::eps)},
      {"weight_decay", Number(&S::weight_decay)},
      {"momentum", Number(&S::momentum)},
  };
  return *fields;
}

const OptionFields<fsdp2_step_options_t>& StepOptionFields() {
  using S = fsdp2_step_options_t;
  static const auto* fields = new OptionFields<S>{
      {"accumulate_grad_batches", Number(&S::accumulate_grad_batches)},
      {"gradient_clip_val", Number(&S::gradient_clip_val)},
  };
  return *fields;
}

strategy::FSDP2StrategyOptions ToStrategyOptions(const fsdp2_strategy_options_t* options) {
  fsdp2_strategy_options_t o;
  fsdp2_strategy_options_init(&o);
  if (options != nullptr) CopyGrown(&o, options);
  return ApplyOptions(strategy::StrategyOptionTable(), StrategyOptionFields(), o);
}

strategy::FSDP2StrategyOptions StrategyOptionsFromJson(const nlohmann::json& config) {
  strategy::FSDP2StrategyOptions out;
  strategy::ApplyJsonOptions(strategy::StrategyOptionTable(), config, &out);
  return out;
}

fsdp2_optimizer_options_t ReadOptimizerOptions(const fsdp2_optimizer_options_t* options) {
  fsdp2_optimizer_options_t o;
  fsdp2_optimizer_options_init(&o);
  if (options != nullptr) CopyGrown(&o, options);
  ApplyOptions(strategy::OptimizerOptionTable(), OptimizerOptionFields(), o);  // the checks
  return o;
}

fsdp2_step_options_t ReadStepOptions(const fsdp2_step_options_t* options) {
  fsdp2_step_options_t o;
  fsdp2_step_options_init(&o);
  if (options != nullptr) CopyGrown(&o, options);
  ApplyOptions(strategy::StepOptionTable(), StepOptionFields(), o);  // the checks
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
// from them. The token loader's options are not the table's (only C,
// Python's token_dataloader and Java's tokenDataLoader take them).

extern "C" {

// Each struct zeroed, then every row's default written into its field.
void fsdp2_strategy_options_init(fsdp2_strategy_options_t* o) {
  using namespace fsdp2;  // NOLINT
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  c_api::WriteDefaults(strategy::StrategyOptionTable(), c_api::StrategyOptionFields(), o);
}

void fsdp2_optimizer_options_init(fsdp2_optimizer_options_t* o) {
  using namespace fsdp2;  // NOLINT
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  c_api::WriteDefaults(strategy::OptimizerOptionTable(), c_api::OptimizerOptionFields(), o);
}

void fsdp2_step_options_init(fsdp2_step_options_t* o) {
  using namespace fsdp2;  // NOLINT
  if (o == nullptr) return;
  std::memset(static_cast<void*>(o), 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  c_api::WriteDefaults(strategy::StepOptionTable(), c_api::StepOptionFields(), o);
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
