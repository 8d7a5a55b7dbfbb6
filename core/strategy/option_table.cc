// The option table (option_table.h): the row of every option of
// FSDP2StrategyOptions, OptimizerOptions and the per-step TrainerOptions
// that a front end sets, in the order the docs list them, with the text
// forms its rows read. Parsing and checking values against a row, the
// flags' text and the schema are in option_values.cc.
#include <nlohmann/json.hpp>

#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "core/comm/backend.h"
#include "core/common/enum_names.h"
#include "core/common/error.h"
#include "core/fsdp/fsdp_options.h"
#include "core/strategy/option_table.h"

namespace fsdp2 {
namespace strategy {
namespace {

using nlohmann::json;

// Builds one row: Row<T>(name, type, default, doc).range(...).flag(...)...
template <typename T>
class Row {
 public:
  Row(const std::string& name, OptionType type, json default_value, const std::string& doc) {
    row_.name = name;
    row_.cpp = name;
    row_.type = type;
    row_.default_value = std::move(default_value);
    row_.doc = doc;
  }
  // The C++ spelling, where it is not the name.
  Row& cpp(const std::string& spelling) { row_.cpp = spelling; return *this; }
  Row& choices(std::vector<std::string> names) { row_.choices = std::move(names); return *this; }
  // Inclusive range [min, max], said as `requirement` ("0 or more").
  Row& range(double min, double max, const std::string& requirement) {
    row_.min = min;
    row_.max = max;
    row_.requirement = requirement;
    return *this;
  }
  Row& min_exclusive() { row_.min_exclusive = true; return *this; }
  Row& max_exclusive() { row_.max_exclusive = true; return *this; }
  Row& normalize(std::function<json(const json&)> f) { row_.normalize = std::move(f); return *this; }
  Row& check(std::function<void(const json&)> f) { row_.check = std::move(f); return *this; }
  // The main job's flag, and its own default when it differs on purpose.
  Row& flag(const std::string& name, json main_job_default = json()) {
    row_.flag = name;
    row_.flag_default = std::move(main_job_default);
    return *this;
  }
  // The main job has no flag for it: how it sets the option instead.
  Row& no_flag(const std::string& note) { row_.flag_note = note; return *this; }
  Row& see(const std::string& page) { row_.see = page; return *this; }
  Row& apply(std::function<void(T&, const json&)> f) { row_.apply = std::move(f); return *this; }
  Row& get(std::function<std::optional<json>(const T&)> f) { row_.get = std::move(f); return *this; }
  // apply and get for a plain field of the struct.
  template <typename F>
  Row& field(F T::*member) {
    row_.apply = [member](T& t, const json& v) { t.*member = v.get<F>(); };
    row_.get = [member](const T& t) -> std::optional<json> { return json(t.*member); };
    return *this;
  }
  operator OptionRow<T>() const { return row_; }  // NOLINT: the table's element

 private:
  OptionRow<T> row_;
};

constexpr double kInt32Max = INT32_MAX;

// The names of an enumeration's values, by its ToString.
template <typename E>
std::vector<std::string> Names(const std::vector<E>& values) {
  std::vector<std::string> names;
  for (const E& value : values) names.emplace_back(ToString(value));
  return names;
}

// A name in a list option's text: no separator of that text inside it.
std::string ListItem(const json& v, const std::string& key, const char* separators) {
  if (!v.is_string()) {
    throw InvalidArgumentError("\"" + key + "\" must hold strings, got " + v.dump());
  }
  const std::string item = v.get<std::string>();
  if (item.find_first_of(separators) != std::string::npos) {
    throw InvalidArgumentError("\"" + key + "\": '" + item + "' contains one of \"" +
                               separators + "\"");
  }
  return item;
}

// ignored_params, frozen_params: a list of names or patterns, as the
// comma-separated text; a string or null as it is.
std::function<json(const json&)> NameList(const std::string& key) {
  return [key](const json& v) -> json {
    if (v.is_null() || v.is_string()) return v;
    if (!v.is_array()) {
      throw InvalidArgumentError("\"" + key + "\" must be a string or a list of strings, got " +
                                 v.dump());
    }
    std::string text;
    for (const auto& item : v) text += (text.empty() ? "" : ",") + ListItem(item, key, ",");
    return text;
  };
}

// *_prefetch_modules: an object {"unit": ["a", "b"]} as the text
// "unit:a,b;..."; a string or null as it is.
std::function<json(const json&)> PrefetchLists(const std::string& key) {
  return [key](const json& v) -> json {
    if (v.is_null() || v.is_string()) return v;
    if (!v.is_object()) {
      throw InvalidArgumentError("\"" + key + "\" must be a string or an object of lists, got " +
                                 v.dump());
    }
    std::string text;
    for (const auto& [unit, listed] : v.items()) {
      if (!listed.is_array()) {
        throw InvalidArgumentError("\"" + key + "\": the list of '" + unit +
                                   "' must be a list of module names, got " + listed.dump());
      }
      text += (text.empty() ? "" : ";") + ListItem(unit, key, ":;,") + ":";
      bool first = true;
      for (const auto& item : listed) {
        text += (first ? "" : ",") + ListItem(item, key, ":;,");
        first = false;
      }
    }
    return text;
  };
}

std::string Join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ",") + name;
  return text;
}

// A name list's canonical value: its text, or null for none.
json NamesOrNull(const std::vector<std::string>& names) {
  return names.empty() ? json() : json(Join(names));
}

json PrefetchText(const std::map<std::string, std::vector<std::string>>& lists) {
  if (lists.empty()) return json();
  std::string text;
  for (const auto& [unit, listed] : lists) text += (text.empty() ? "" : ";") + unit + ":" + Join(listed);
  return text;
}

bool SamePolicy(const fsdp::MixedPrecisionPolicy& a, const fsdp::MixedPrecisionPolicy& b) {
  return a.param_dtype == b.param_dtype && a.reduce_dtype == b.reduce_dtype &&
         a.output_dtype == b.output_dtype && a.cast_forward_inputs == b.cast_forward_inputs;
}

const std::vector<fsdp::ShardingStrategy> kShardingStrategies = {
    fsdp::ShardingStrategy::kFullShard, fsdp::ShardingStrategy::kShardGradOp,
    fsdp::ShardingStrategy::kNoShard, fsdp::ShardingStrategy::kHybridShard};
const std::vector<std::string> kShardingNames = {"full_shard", "shard_grad_op", "no_shard",
                                                 "hybrid_shard"};
const std::vector<std::string> kAcNames = {"none", "full", "selective"};

using Strategy = FSDP2StrategyOptions;

OptionTable<Strategy> MakeStrategyTable() {
  auto parallel_size = [](ParallelSize Strategy::*member) {
    return std::make_pair(
        [member](Strategy& o, const json& v) {
          (o.*member) = v.is_string() ? ParallelSize::Auto() : ParallelSize::Of(v.get<int>());
        },
        [member](const Strategy& o) -> std::optional<json> {
          const auto& size = (o.*member).value;
          return size ? json(*size) : json("auto");
        });
  };
  const auto dp = parallel_size(&Strategy::data_parallel_size);
  const auto tp = parallel_size(&Strategy::tensor_parallel_size);
  return {
      Row<Strategy>("data_parallel_size", OptionType::kSize, "auto",
                    "data-parallel ranks; auto: what tensor_parallel_size leaves of the world "
                    "(both auto: dp = world size, tp = 1); dp x tp must equal the world size")
          .range(1, (1 << 30) - 1, "a positive integer")
          .no_flag("the ranks --nproc starts, over --tensor-parallel")
          .apply(dp.first).get(dp.second),
      Row<Strategy>("tensor_parallel_size", OptionType::kSize, "auto",
                    "ranks per tensor-parallel group (neighbouring ranks); needs a model plan "
                    "and costs two all-reduces of activations per block; refused with "
                    "hybrid_shard")
          .range(1, (1 << 30) - 1, "a positive integer")
          .flag("tensor-parallel").see("tensor-parallel.md")
          .apply(tp.first).get(tp.second),
      Row<Strategy>("shuffle", OptionType::kBool, true,
                    "reshuffle the loaders' rows each epoch")
          .cpp("data_sampler.shuffle").flag("shuffle")
          .apply([](Strategy& o, const json& v) { o.data_sampler.shuffle = v.get<bool>(); })
          .get([](const Strategy& o) -> std::optional<json> { return json(o.data_sampler.shuffle); }),
      Row<Strategy>("drop_last", OptionType::kBool, true,
                    "drop a last partial global batch; false pads it from the epoch's start")
          .cpp("data_sampler.drop_last").flag("drop-last")
          .apply([](Strategy& o, const json& v) { o.data_sampler.drop_last = v.get<bool>(); })
          .get([](const Strategy& o) -> std::optional<json> { return json(o.data_sampler.drop_last); }),
      Row<Strategy>("precision", OptionType::kChoice, "bf16",
                    "bf16: bf16 gathers and compute, fp32 master shards and reductions "
                    "(DefaultMixedPrecision()); fp32: fp32 throughout")
          .cpp("mp_policy").choices({"fp32", "bf16"}).see("mixed-precision.md")
          .flag("mixed-precision", "fp32")
          .apply([](Strategy& o, const json& v) {
            o.mp_policy = v == "bf16" ? DefaultMixedPrecision() : fsdp::MixedPrecisionPolicy{};
          })
          .get([](const Strategy& o) -> std::optional<json> {
            if (SamePolicy(o.mp_policy, DefaultMixedPrecision())) return json("bf16");
            if (SamePolicy(o.mp_policy, fsdp::MixedPrecisionPolicy{})) return json("fp32");
            return std::nullopt;  // C++ takes any policy
          }),
      Row<Strategy>("sharding_strategy", OptionType::kChoice, "full_shard",
                    "what FSDP shards: parameters, gradients and optimizer state (full_shard), "
                    "all but the parameters between forward and backward (shard_grad_op), "
                    "nothing (no_shard, DDP), or within groups (hybrid_shard)")
          .choices(kShardingNames).flag("strategy").see("sharding.md")
          .apply([](Strategy& o, const json& v) {
            for (size_t i = 0; i < kShardingNames.size(); ++i) {
              if (v == kShardingNames[i]) o.sharding_strategy = kShardingStrategies[i];
            }
          })
          .get([](const Strategy& o) -> std::optional<json> {
            return json(kShardingNames.at(static_cast<size_t>(o.sharding_strategy)));
          }),
      Row<Strategy>("reshard_after_forward", OptionType::kInt, -1,
                    "free gathered parameters after forward: -1 the strategy's own (yes for "
                    "full_shard and hybrid_shard), 0 keep them to backward (one all-gather "
                    "less, the whole model's parameters held), 1 free them, k keep them "
                    "sharded over groups of k ranks so backward's all-gather stays in a group")
          .cpp("reshard_after_forward, reshard_after_forward_size")
          .range(-1, kInt32Max, "-1 (the strategy's default), 0, 1 or a group size")
          .normalize([](const json& v) -> json {
            if (v.is_null()) return -1;
            if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
            return v;
          })
          .flag("reshard-after-forward").see("sharding.md")
          .apply([](Strategy& o, const json& v) { o.set_reshard_after_forward(v.get<int>()); })
          .get([](const Strategy& o) -> std::optional<json> {
            if (o.reshard_after_forward_size > 0) return json(o.reshard_after_forward_size);
            if (o.reshard_after_forward) return json(*o.reshard_after_forward ? 1 : 0);
            return json(-1);
          }),
      Row<Strategy>("shard_group_size", OptionType::kInt, 0,
                    "hybrid_shard's ranks per shard group; 0: the ranks of one host; must "
                    "divide the data-parallel size")
          .range(0, kInt32Max, "0 (the ranks of one host) or positive")
          .flag("shard-group-size").see("sharding.md")
          .field(&Strategy::shard_group_size),
      Row<Strategy>("cpu_offload", OptionType::kBool, false,
                    "keep each rank's shards, gradients and optimizer state in host memory, "
                    "the optimizer stepping there unit by unit during backward; on the CPU it "
                    "changes nothing")
          .flag("cpu-offload").see("gpu.md")
          .field(&Strategy::cpu_offload),
      Row<Strategy>("pin_memory", OptionType::kBool, true,
                    "with cpu_offload: host buffers in page-locked memory, so that copies to and "
                    "from the GPU run asynchronously")
          .flag("pin-memory").see("gpu.md")
          .field(&Strategy::pin_memory),
      Row<Strategy>("gpu_memory_limit_gib", OptionType::kNumber, 0.0,
                    "cap this process's GPU memory at this many GiB (PyTorch's per-process "
                    "memory fraction), a smaller GPU emulated; 0: the whole GPU")
          .range(0, std::numeric_limits<double>::infinity(),
                 "0 (the whole GPU) or a positive number of GiB")
          .flag("gpu-memory-limit").see("gpu.md")
          .field(&Strategy::gpu_memory_limit_gib),
      Row<Strategy>("device", OptionType::kText, "auto",
                    "where each rank trains: auto (its GPU where CUDA devices are visible, "
                    "else the CPU), cpu, cuda (the local rank's GPU) or cuda:K")
          .choices({"auto", "cpu", "cuda", "cuda:K"})
          .check([](const json& v) {
            if (v.is_null()) throw InvalidArgumentError("device must be a string, got null");
            DeviceSpec::Parse(v.get<std::string>());
          })
          .flag("device").see("gpu.md")
          .apply([](Strategy& o, const json& v) { o.device = DeviceSpec::Parse(v.get<std::string>()); })
          .get([](const Strategy& o) -> std::optional<json> { return json(o.device.ToString()); }),
      Row<Strategy>("backend", OptionType::kChoice, "gloo",
                    "the process groups' library: nccl, one GPU per rank (CUDA builds); gloo "
                    "stages device tensors through host memory")
          .choices(Names(comm::AllBackends()))
          .no_flag("the FSDP2_BACKEND variable").see("gpu.md")
          .apply([](Strategy& o, const json& v) { o.backend = comm::ParseBackend(v.get<std::string>()); })
          .get([](const Strategy& o) -> std::optional<json> { return json(ToString(o.backend)); }),
      Row<Strategy>("timeout_ms", OptionType::kInt, 300000,
                    "how long a rendezvous or collective may take before it fails with an "
                    "error, in milliseconds (5 minutes)")
          .cpp("timeout").range(1, static_cast<double>(INT64_MAX), "positive")
          .no_flag("--timeout SECONDS (FSDP2_TIMEOUT_S or 300)")
          .apply([](Strategy& o, const json& v) {
            o.timeout = std::chrono::milliseconds(v.get<int64_t>());
          })
          .get([](const Strategy& o) -> std::optional<json> {
            return json(static_cast<int64_t>(o.timeout.count()));
          }),
      Row<Strategy>("checkpoint_format", OptionType::kChoice, "sharded",
                    "what save_checkpoint writes: sharded (every rank its rows) or full (rank "
                    "0 one safetensors file); loading reads either")
          .choices(Names(AllCheckpointFormats())).flag("checkpoint-format").see("checkpoints.md")
          .apply([](Strategy& o, const json& v) {
            o.checkpoint_format = ParseCheckpointFormat(v.get<std::string>());
          })
          .get([](const Strategy& o) -> std::optional<json> {
            return json(ToString(o.checkpoint_format));
          }),
      Row<Strategy>("seed", OptionType::kUInt64, 0,
                    "torch::manual_seed on every rank in setup_environment(), and the "
                    "sampler's permutation seed")
          .cpp("seed, data_sampler.seed").flag("seed", 1337)
          .apply([](Strategy& o, const json& v) {
            o.seed = v.get<uint64_t>();
            o.data_sampler.seed = o.seed;
          })
          .get([](const Strategy& o) -> std::optional<json> { return json(o.seed); }),
      Row<Strategy>("activation_checkpointing", OptionType::kChoice, "none",
                    "recompute blocks in backward instead of keeping their activations: none, "
                    "full (every block) or selective (every ac_every-th); true is full, false "
                    "none")
          .choices(kAcNames)
          .normalize([](const json& v) -> json {
            if (v.is_boolean()) return v.get<bool>() ? "full" : "none";
            return v;
          })
          .no_flag("--activation-checkpointing 0|1 with --ac-every K (1: every block)")
          .see("activation-checkpointing.md")
          .apply([](Strategy& o, const json& v) {
            using Mode = fsdp::ActivationCheckpointing::Mode;
            auto& ac = o.activation_checkpointing;
            if (v == "none") ac = fsdp::ActivationCheckpointing::None();
            if (v == "full") ac = fsdp::ActivationCheckpointing::Full();
            if (v == "selective") ac.mode = Mode::kSelective;
          })
          .get([](const Strategy& o) -> std::optional<json> {
            return json(kAcNames.at(static_cast<size_t>(o.activation_checkpointing.mode)));
          }),
      Row<Strategy>("ac_every", OptionType::kInt, 2,
                    "selective activation checkpointing: every k-th block")
          .cpp("activation_checkpointing.every")
          .range(1, kInt32Max, "at least 1 (checkpoint every k-th block)")
          .no_flag("--ac-every K").see("activation-checkpointing.md")
          .apply([](Strategy& o, const json& v) {
            // After activation_checkpointing's row: only selective counts.
            auto& ac = o.activation_checkpointing;
            if (ac.mode == fsdp::ActivationCheckpointing::Mode::kSelective) ac.every = v.get<int>();
          })
          .get([](const Strategy& o) -> std::optional<json> {
            const auto& ac = o.activation_checkpointing;
            return json(ac.mode == fsdp::ActivationCheckpointing::Mode::kFull ? 1 : ac.every);
          }),
      Row<Strategy>("forward_prefetch", OptionType::kInt, 1,
                    "units all-gathered ahead in forward; 0 exposes every all-gather and holds "
                    "one unit, each more holds one more unit's parameters")
          .range(0, kInt32Max,
                 "0 or more (forward_prefetch and backward_prefetch count units gathered ahead)")
          .flag("forward-prefetch").see("sharding.md")
          .field(&Strategy::forward_prefetch),
      Row<Strategy>("backward_prefetch", OptionType::kInt, 1,
                    "units all-gathered ahead in backward, as forward_prefetch")
          .range(0, kInt32Max,
                 "0 or more (forward_prefetch and backward_prefetch count units gathered ahead)")
          .flag("backward-prefetch").see("sharding.md")
          .field(&Strategy::backward_prefetch),
      Row<Strategy>("gradient_divide_factor", OptionType::kNumber, 0.0,
                    "reduced gradients are divided by it; 0: the data-parallel size (the "
                    "mean); 1 sums them; the reported loss stays the mean")
          .range(0, HUGE_VAL, "0 (the data-parallel size) or positive")
          .flag("gradient-divide-factor").see("sharding.md")
          .field(&Strategy::gradient_divide_factor),
      Row<Strategy>("gradient_accumulation", OptionType::kChoice, "local",
                    "micro-batches without gradient sync: local keeps unsharded gradients "
                    "and communicates at the last; sharded reduce-scatters each one (one "
                    "sharded gradient held) and all-reduces across replicas at the last")
          .choices(Names(AllGradientAccumulations())).flag("grad-accum-mode").see("sharding.md")
          .apply([](Strategy& o, const json& v) {
            o.gradient_accumulation =
                v == "sharded" ? GradientAccumulation::kSharded : GradientAccumulation::kLocal;
          })
          .get([](const Strategy& o) -> std::optional<json> {
            return json(ToString(o.gradient_accumulation));
          }),
      Row<Strategy>("forward_prefetch_modules", OptionType::kText, nullptr,
                    "explicit forward prefetch lists by module name, in place of the depth "
                    "for those units: \"unit:a,b;unit:c\" (\"\" is the root; JSON also "
                    "{\"unit\": [\"a\", \"b\"]})")
          .normalize(PrefetchLists("forward_prefetch_modules"))
          .check([](const json& v) {
            if (v.is_string()) ParsePrefetchModules(v.get<std::string>(), "forward_prefetch_modules");
          })
          .flag("forward-prefetch-modules").see("sharding.md")
          .apply([](Strategy& o, const json& v) {
            o.forward_prefetch_modules.clear();
            if (v.is_string()) {
              o.forward_prefetch_modules =
                  ParsePrefetchModules(v.get<std::string>(), "forward_prefetch_modules");
            }
          })
          .get([](const Strategy& o) -> std::optional<json> {
            return PrefetchText(o.forward_prefetch_modules);
          }),
      Row<Strategy>("backward_prefetch_modules", OptionType::kText, nullptr,
                    "explicit backward prefetch lists, as forward_prefetch_modules")
          .normalize(PrefetchLists("backward_prefetch_modules"))
          .check([](const json& v) {
            if (v.is_string()) ParsePrefetchModules(v.get<std::string>(), "backward_prefetch_modules");
          })
          .flag("backward-prefetch-modules").see("sharding.md")
          .apply([](Strategy& o, const json& v) {
            o.backward_prefetch_modules.clear();
            if (v.is_string()) {
              o.backward_prefetch_modules =
                  ParsePrefetchModules(v.get<std::string>(), "backward_prefetch_modules");
            }
          })
          .get([](const Strategy& o) -> std::optional<json> {
            return PrefetchText(o.backward_prefetch_modules);
          }),
      Row<Strategy>("ignored_params", OptionType::kText, nullptr,
                    "parameters kept whole on every rank, by name or glob (\"lm_head.*\"), "
                    "comma-separated (JSON also a list): never sharded, gathered or reduced; "
                    "full size in memory on each rank; under mixed precision cast with their "
                    "block for its forward and backward, value and gradient kept in their "
                    "own dtype")
          .normalize(NameList("ignored_params")).flag("ignored-params").see("sharding.md")
          .apply([](Strategy& o, const json& v) {
            o.ignored_params = v.is_string() ? SplitNames(v.get<std::string>())
                                             : std::vector<std::string>{};
          })
          .get([](const Strategy& o) -> std::optional<json> { return NamesOrNull(o.ignored_params); }),
      Row<Strategy>("ignored_params_all_reduce", OptionType::kBool, false,
                    "true: backward() all-reduces the ignored parameters' gradients (one "
                    "all-reduce each), so training equals one process; false (PyTorch's "
                    "rule): each rank keeps its own and the copies drift apart")
          .flag("ignored-params-all-reduce").see("sharding.md")
          .field(&Strategy::ignored_params_all_reduce),
      Row<Strategy>("frozen_params", OptionType::kText, nullptr,
                    "parameters not trained, by name or glob, comma-separated (JSON also a "
                    "list): no gradient, no gradient memory, no reduction, no optimizer state; "
                    "still sharded, gathered and saved")
          .normalize(NameList("frozen_params")).flag("frozen-params").see("your-model.md")
          .apply([](Strategy& o, const json& v) {
            o.frozen_params = v.is_string() ? SplitNames(v.get<std::string>())
                                            : std::vector<std::string>{};
          })
          .get([](const Strategy& o) -> std::optional<json> { return NamesOrNull(o.frozen_params); }),
      Row<Strategy>("profile_steps", OptionType::kInt, 0,
                    "a Chrome/Perfetto trace of this many training steps through LibTorch's "
                    "profiler (CPU ops, CUDA kernels, copies, the collectives' streams); 0: none")
          .range(0, kInt32Max, "0 (no trace) or more").flag("profile").see("gpu.md")
          .field(&Strategy::profile_steps),
      Row<Strategy>("profile_wait_steps", OptionType::kInt, 1,
                    "steps run before the trace starts (the first step's one-time costs stay "
                    "out)")
          .range(0, kInt32Max, "0 or more").flag("profile-wait").see("gpu.md")
          .field(&Strategy::profile_wait_steps),
      Row<Strategy>("profile_path", OptionType::kText, "fsdp2_trace.json",
                    "the trace file; with several ranks rank r writes it with \".rank<r>\" "
                    "before the extension; open it at ui.perfetto.dev")
          .flag("profile-path").see("gpu.md")
          .apply([](Strategy& o, const json& v) {
            o.profile_path = v.is_string() ? v.get<std::string>() : std::string();
          })
          .get([](const Strategy& o) -> std::optional<json> {
            return o.profile_path.empty() ? json() : json(o.profile_path);
          }),
  };
}

const std::vector<OptimizerKind> kOptimizerKinds = {OptimizerKind::kAdamW, OptimizerKind::kAdam,
                                                    OptimizerKind::kSGD};

OptionTable<OptimizerOptions> MakeOptimizerTable() {
  using O = OptimizerOptions;
  const char* kMainJob = "the main job trains with GPT-2's AdamW (models::GPT2AdamW)";
  return {
      Row<O>("kind", OptionType::kChoice, "adamw",
             "adamw (FusedAdamW: decoupled weight decay), adam or sgd")
          .choices(Names(kOptimizerKinds)).no_flag(kMainJob)
          .apply([](O& o, const json& v) { o.kind = ParseOptimizerKind(v.get<std::string>()); })
          .get([](const O& o) -> std::optional<json> { return json(ToString(o.kind)); }),
      Row<O>("lr", OptionType::kNumber, 1e-3, "the learning rate")
          .range(0, HUGE_VAL, "positive").min_exclusive().flag("lr", 3e-3).field(&O::lr),
      Row<O>("beta1", OptionType::kNumber, 0.9, "Adam and AdamW: the first moment's decay")
          .range(0, 1, "in [0, 1)").max_exclusive().no_flag(kMainJob).field(&O::beta1),
      Row<O>("beta2", OptionType::kNumber, 0.999, "Adam and AdamW: the second moment's decay")
          .range(0, 1, "in [0, 1)").max_exclusive().no_flag(kMainJob).field(&O::beta2),
      Row<O>("eps", OptionType::kNumber, 1e-8, "Adam and AdamW: added to the denominator")
          .range(0, HUGE_VAL, "positive").min_exclusive().no_flag(kMainJob).field(&O::eps),
      Row<O>("weight_decay", OptionType::kNumber, 0.01,
             "decoupled for AdamW; an L2 term for Adam and SGD")
          .range(0, HUGE_VAL, "0 or more").no_flag(kMainJob).field(&O::weight_decay),
      Row<O>("momentum", OptionType::kNumber, 0.0, "SGD's momentum")
          .range(0, HUGE_VAL, "0 or more").no_flag(kMainJob).field(&O::momentum),
  };
}

OptionTable<TrainerOptions> MakeStepTable() {
  using T = TrainerOptions;
  return {
      Row<T>("accumulate_grad_batches", OptionType::kInt, 1,
             "micro-batches per optimizer step (C, Python, Java: equal slices of the batch's "
             "rows); gradients are communicated on the last")
          .range(1, kInt32Max, "at least 1").flag("grad-accum")
          .field(&T::accumulate_grad_batches),
      Row<T>("gradient_clip_val", OptionType::kNumber, 0.0,
             "clip gradients to this global norm over every shard; 0: no clipping")
          .range(0, HUGE_VAL, "0 (off) or a positive number").flag("clip", 1.0)
          .field(&T::gradient_clip_val),
  };
}

}  // namespace

void FSDP2StrategyOptions::set_reshard_after_forward(int value) {
  ParseOption(*FindOption(StrategyOptionTable(), "reshard_after_forward"), value);  // its check
  reshard_after_forward = c10::nullopt;
  reshard_after_forward_size = 0;
  if (value == 0 || value == 1) {
    reshard_after_forward = value == 1;
  } else if (value > 1) {
    reshard_after_forward_size = value;
  }
}

std::vector<std::string> SplitNames(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, separator);) {
    const size_t begin = item.find_first_not_of(" \t");
    if (begin == std::string::npos) continue;
    items.push_back(item.substr(begin, item.find_last_not_of(" \t") - begin + 1));
  }
  return items;
}

std::map<std::string, std::vector<std::string>> ParsePrefetchModules(const std::string& text,
                                                                     const char* option) {
  std::map<std::string, std::vector<std::string>> lists;
  std::stringstream in(text);
  for (std::string entry; std::getline(in, entry, ';');) {
    if (entry.find_first_not_of(" \t") == std::string::npos) continue;
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) {
      throw InvalidArgumentError(std::string(option) + ": entry '" + entry +
                                 "' has no ':' (write \"unit:listed,listed;unit:listed\")");
    }
    const std::vector<std::string> unit = SplitNames(entry.substr(0, colon));
    if (unit.size() > 1) {
      throw InvalidArgumentError(std::string(option) + ": entry '" + entry +
                                 "' names more than one unit before its ':'");
    }
    const std::string name = unit.empty() ? "" : unit[0];
    if (!lists.emplace(name, SplitNames(entry.substr(colon + 1))).second) {
      throw InvalidArgumentError(std::string(option) + ": unit '" + name + "' is given twice");
    }
  }
  return lists;
}

const OptionTable<FSDP2StrategyOptions>& StrategyOptionTable() {
  static const auto* table = new OptionTable<FSDP2StrategyOptions>(MakeStrategyTable());
  return *table;
}

const OptionTable<OptimizerOptions>& OptimizerOptionTable() {
  static const auto* table = new OptionTable<OptimizerOptions>(MakeOptimizerTable());
  return *table;
}

const OptionTable<TrainerOptions>& StepOptionTable() {
  static const auto* table = new OptionTable<TrainerOptions>(MakeStepTable());
  return *table;
}

}  // namespace strategy
}  // namespace fsdp2
