// fsdp2/c_api/internal/options.h
//
// The C option structs (fsdp2_*_options_t) over the option table
// (core/strategy/option_table.h). The table has every option's default,
// check and conversion; this file only says where each option sits in its
// C struct (a binding per field: OptionFields) and runs the table's rows
// over the struct: the defaults (*_init), JSON (*_from_json), and the
// checks and conversion to the core's options (To*Options). CopyGrown
// copies a caller's struct of any (older) size. Adding an option: see
// c_api/README.md ("Adding an option").
#ifndef FSDP2_C_API_INTERNAL_OPTIONS_H_
#define FSDP2_C_API_INTERNAL_OPTIONS_H_

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "core/common/error.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/option_table.h"
#include "core/strategy/token_dataset.h"

namespace fsdp2 {
namespace c_api {

// Copies the caller's `src` over `dst` (already holding the defaults):
// fields beyond the caller's struct_size keep dst's values, so a caller
// compiled against an older, shorter struct still works.
template <typename Options>
void CopyGrown(Options* dst, const Options* src) {
  const size_t n = std::min(src->struct_size, sizeof(Options));
  Require(src->struct_size >= sizeof(size_t),
          "options.struct_size is " + std::to_string(src->struct_size) +
              "; set it to sizeof the struct (call the *_init function first)");
  std::memcpy(static_cast<void*>(dst), src, n);
  dst->struct_size = sizeof(Options);
}

// Copies `o` back into the caller's struct, as many bytes as it declares.
template <typename Options>
void CopyBack(const Options& o, Options* caller) {
  const size_t caller_size = caller->struct_size;
  std::memcpy(static_cast<void*>(caller), &o, std::min(caller_size, sizeof(o)));
  caller->struct_size = caller_size;
}

// `json` parsed; InvalidArgumentError unless it is a JSON object.
nlohmann::json ParseObject(const char* json, const char* what);

// A copy of `s` that lives until the process ends (one per distinct
// string): what *_from_json puts in an option struct's string fields.
const char* InternString(const std::string& s);

// Where one option sits in a C struct: its field read as the option's
// canonical JSON (strategy::ParseOption checks it; a C enum code it does
// not know throws) and a canonical value written into it.
template <typename CStruct>
struct OptionField {
  std::function<nlohmann::json(const CStruct&)> read;
  std::function<void(CStruct&, const nlohmann::json&)> write;
};
// Every option of a C struct by its row's name; one field per row.
template <typename CStruct>
using OptionFields = std::map<std::string, OptionField<CStruct>>;

const OptionFields<fsdp2_strategy_options_t>& StrategyOptionFields();
const OptionFields<fsdp2_optimizer_options_t>& OptimizerOptionFields();
const OptionFields<fsdp2_step_options_t>& StepOptionFields();

// The caller's options (NULL: defaults), checked by every row and
// converted by the rows into the core's options.
strategy::FSDP2StrategyOptions ToStrategyOptions(const fsdp2_strategy_options_t* options);
// The options of a JSON object (keys not given: their defaults), each
// parsed and checked by its row and applied (strategy::ApplyJsonOptions).
strategy::FSDP2StrategyOptions StrategyOptionsFromJson(const nlohmann::json& config);
// The caller's optimizer and step options (NULL: defaults), every row's
// check run, as the struct.
fsdp2_optimizer_options_t ReadOptimizerOptions(const fsdp2_optimizer_options_t* options);
fsdp2_step_options_t ReadStepOptions(const fsdp2_step_options_t* options);
// Also returns the global batch size.
std::pair<strategy::TokenDatasetOptions, int64_t> ToTokenDatasetOptions(
    const fsdp2_token_loader_options_t* options);

// *_from_json's loop: every key of `config` (a JSON object) parsed by its
// row and written into its field of `o`; InvalidArgumentError for a key no
// row has, naming the known ones.
template <typename CStruct, typename Target>
void ReadJsonOptions(const strategy::OptionTable<Target>& table,
                     const OptionFields<CStruct>& fields, const nlohmann::json& config,
                     CStruct* o) {
  for (const auto& [key, value] : config.items()) {
    const strategy::OptionRow<Target>* row = strategy::FindOption(table, key);
    if (row == nullptr) strategy::UnknownOption(table, key);
    fields.at(key).write(*o, strategy::ParseOption(*row, value));
  }
}

// *_init's loop: every row's default written into its field.
template <typename CStruct, typename Target>
void WriteDefaults(const strategy::OptionTable<Target>& table,
                   const OptionFields<CStruct>& fields, CStruct* o) {
  for (const auto& row : table) {
    const auto field = fields.find(row.name);
    if (field != fields.end()) field->second.write(*o, row.default_value);
  }
}

// Every field read, checked by its row and applied to a `Target`.
template <typename CStruct, typename Target>
Target ApplyOptions(const strategy::OptionTable<Target>& table,
                    const OptionFields<CStruct>& fields, const CStruct& o) {
  Target out;
  for (const auto& row : table) {
    row.apply(out, strategy::ParseOption(row, fields.at(row.name).read(o)));
  }
  return out;
}

}  // namespace c_api
}  // namespace fsdp2

#endif  // FSDP2_C_API_INTERNAL_OPTIONS_H_
