// fsdp2/core/strategy/option_table.h
//
// The one table of options. Every option a front end can set is a row
// here: its name, type, default, allowed values or range, any further
// check, one line of documentation, the main job's flag, and how a value
// is applied to (and read back from) the C++ options struct. A default or
// a check exists in its row only; the front ends read the rows:
//
//   - the C ABI: *_options_init (the defaults), *_options_from_json (one
//     loop over the rows), fsdp2_strategy_create (the checks, then the
//     rows' apply) and fsdp2_options_schema() (the table as JSON), which
//     Python's keywords and docstrings, Java's test of its builder and the
//     docs' tables read;
//   - the main job (examples/train_gpt.cc): one flag per row that names one;
//   - C++: FSDP2Strategy's constructor runs every row's check.
//
// Values travel as JSON in one canonical form per OptionType, which
// ParseOption makes from whatever a front end may pass for the option (true
// for "full", a list for a comma-separated text, ...), or refuses with an
// InvalidArgumentError that names the option and what it must be.
//
// Adding an option: a row in option_table.cc (its position there is its
// place in the docs) and the C++ field it applies to. Every front end then
// has it: the C ABI's JSON, Python's keywords, Java's set(key, value), the
// main job's flag and the docs (bazel run //docs:option_tables). Written by
// hand, because they are ABI or typed API: the C struct's field (appended,
// c_api/fsdp2.h) with its binding (c_api/internal/options.cc), and Java's
// typed setter; tests fail until both exist.
#ifndef FSDP2_CORE_STRATEGY_OPTION_TABLE_H_
#define FSDP2_CORE_STRATEGY_OPTION_TABLE_H_

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/optimizer.h"
#include "core/strategy/trainer.h"

namespace fsdp2 {
namespace strategy {

// The kinds of value an option takes, each with one canonical JSON form.
enum class OptionType {
  kBool,    // true or false (a front end may pass 0 or 1)
  kInt,     // a whole number within [min, max]
  kUInt64,  // a whole number from 0 to 2^64 - 1
  kNumber,  // a finite number within [min, max]
  kChoice,  // one of `choices`, a string
  kSize,    // "auto" or a whole number within [min, max]
  kText,    // a string, or null for none
};
// "bool", "int", "uint64", "number", "choice", "size" or "text".
const char* ToString(OptionType type);

// What a row says of its option, whatever struct it applies to.
struct OptionSpec {
  std::string name;  // JSON key, C field, Python keyword (Java: its camelCase)
  std::string cpp;   // the C++ struct's spelling, for the docs ("data_sampler.shuffle")
  OptionType type = OptionType::kInt;  // what values it takes
  nlohmann::json default_value;  // canonical
  std::string doc;               // one line: what it does, and what it costs
  // kChoice: the names (the C ABI's enum codes are their positions). Other
  // types: the forms a value takes, for the docs (e.g. "cuda:K").
  std::vector<std::string> choices;
  // kInt, kNumber, kSize: the smallest value, inclusive unless
  // min_exclusive.
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();  // the largest, as min
  bool min_exclusive = false;  // min itself is refused
  bool max_exclusive = false;  // max itself is refused
  // The range in words, for messages and docs ("0 or more").
  std::string requirement;
  // Other forms a front end may pass, turned into the canonical one before
  // the type is checked (e.g. true -> "full"); may throw
  // InvalidArgumentError.
  std::function<nlohmann::json(const nlohmann::json&)> normalize;
  // A check beyond type and range, on the canonical value; throws
  // InvalidArgumentError.
  std::function<void(const nlohmann::json&)> check;
  // The main job's flag (without "--"), or "" when it sets the option
  // another way, which flag_note then says.
  std::string flag;
  // The main job's own default, when it differs on purpose (its seed, its
  // fp32); null: default_value.
  nlohmann::json flag_default;
  std::string flag_note;  // without a flag: how the main job sets it
  std::string see;  // the docs page that says more ("sharding.md"), or ""
};

// A row: the spec, and how a canonical value reaches a `Target` (the C++
// options struct: FSDP2StrategyOptions, OptimizerOptions, TrainerOptions).
template <typename Target>
struct OptionRow : OptionSpec {
  // Writes a canonical value into the struct.
  std::function<void(Target&, const nlohmann::json&)> apply;
  // The struct's value in canonical form, or nullopt for a value only C++
  // can hold (a mixed-precision policy other than fp32 or bf16), which the
  // table neither shows nor checks.
  std::function<std::optional<nlohmann::json>(const Target&)> get;
};

// Every option of one C++ struct, in the order the docs list them.
template <typename Target>
using OptionTable = std::vector<OptionRow<Target>>;

// FSDP2StrategyOptions' rows, in the order the docs list them.
const OptionTable<FSDP2StrategyOptions>& StrategyOptionTable();
// OptimizerOptions' rows (the C ABI's fsdp2_optimizer_options_t).
const OptionTable<OptimizerOptions>& OptimizerOptionTable();
// The step options the front ends set per training step: TrainerOptions'
// accumulate_grad_batches and gradient_clip_val (the C ABI's
// fsdp2_step_options_t).
const OptionTable<TrainerOptions>& StepOptionTable();

// `value` in the option's canonical form, checked (type, range, choices,
// its row's check). Throws InvalidArgumentError naming the option.
nlohmann::json ParseOption(const OptionSpec& spec, const nlohmann::json& value);
// A flag's text ("1", "auto", "0.5", "a,b"; "" for a text option: none) as
// ParseOption takes it, then ParseOption.
nlohmann::json ParseOptionText(const OptionSpec& spec, const std::string& text);
// A canonical value as a flag's text: ParseOptionText reads it back
// ("1"/"0" for booleans, "" for none).
std::string OptionText(const nlohmann::json& value);

// The row named `name`, or nullptr.
template <typename Target>
const OptionRow<Target>* FindOption(const OptionTable<Target>& table, const std::string& name) {
  for (const auto& row : table) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

// Throws InvalidArgumentError("unknown option \"key\" (known: ...)") naming
// every row.
template <typename Target>
[[noreturn]] void UnknownOption(const OptionTable<Target>& table, const std::string& key) {
  std::string known;
  for (const auto& row : table) known += (known.empty() ? "" : ", ") + row.name;
  throw InvalidArgumentError("unknown option \"" + key + "\" (known: " + known + ")");
}

// Every key of `config` (a JSON object) parsed and checked by its row and
// applied to `target`; keys not given leave `target` as it is (a
// default-constructed struct holds the rows' defaults). Throws
// InvalidArgumentError for a key no row has, or a value its row refuses.
template <typename Target>
void ApplyJsonOptions(const OptionTable<Target>& table, const nlohmann::json& config,
                      Target* target) {
  if (!config.is_object()) throw InvalidArgumentError("options must be a JSON object");
  for (const auto& item : config.items()) {
    if (FindOption(table, item.key()) == nullptr) UnknownOption(table, item.key());
  }
  // In the table's order, so that an option applies after those it refines
  // (ac_every after activation_checkpointing).
  for (const auto& row : table) {
    const auto value = config.find(row.name);
    if (value != config.end()) row.apply(*target, ParseOption(row, *value));
  }
}

// Every row's check on the struct's value (rows whose get gives nullopt
// are skipped). Throws InvalidArgumentError, its message prefixed by
// `prefix`.
template <typename Target>
void CheckOptions(const OptionTable<Target>& table, const Target& target,
                  const std::string& prefix = "") {
  for (const auto& row : table) {
    const std::optional<nlohmann::json> value = row.get(target);
    if (!value) continue;
    try {
      ParseOption(row, *value);
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(prefix + e.what());
    }
  }
}

// The text forms of the options that name modules or parameters (the C
// ABI's strings, the main job's flags), which their rows read:
// "a, b,c" as {"a", "b", "c"}: blanks around items dropped, empty items
// skipped.
std::vector<std::string> SplitNames(const std::string& text, char separator = ',');

// The text form of FSDP2StrategyOptions::forward_prefetch_modules (and
// backward_): "unit:listed,listed;unit:listed" ("" before the colon: the
// root; nothing after it: an empty list). Throws std::invalid_argument
// naming `option` for an entry without its colon, with more than one unit
// before it, or a unit given twice.
std::map<std::string, std::vector<std::string>> ParsePrefetchModules(const std::string& text,
                                                                     const char* option);

// The rows as JSON, for fsdp2_options_schema() and the docs:
// {"strategy": [row, ...], "optimizer": [...], "step": [...]}, each row
// {"name", "cpp", "type", "default", "doc", and where they apply "choices",
// "min", "max", "min_exclusive", "max_exclusive", "requirement", "flag",
// "flag_default", "flag_note", "see"}.
const nlohmann::json& OptionSchema();

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_OPTION_TABLE_H_
