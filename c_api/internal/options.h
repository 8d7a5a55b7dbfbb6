// fsdp2/c_api/internal/options.h
//
// The C option structs (fsdp2_*_options_t) read safely and turned into the
// core's options: CopyGrown copies a caller's struct of any (older) size,
// the Json* helpers read one JSON value with a message naming the key, and
// To*Options validate a struct and convert it. Adding an option: see
// c_api/README.md ("Adding an option").
#ifndef FSDP2_C_API_INTERNAL_OPTIONS_H_
#define FSDP2_C_API_INTERNAL_OPTIONS_H_

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "core/common/error.h"
#include "core/strategy/fsdp2_strategy.h"
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

// "auto" (0) or a positive integer.
int32_t JsonSize(const nlohmann::json& v, const std::string& key);
// true/false or 0/1, as 1/0.
int32_t JsonBool(const nlohmann::json& v, const std::string& key);
// Throws InvalidArgumentError("unknown option ... (known: <known>)").
[[noreturn]] void UnknownKey(const std::string& key, const char* known);

template <typename T>
T JsonNumber(const nlohmann::json& v, const std::string& key) {
  if (std::is_unsigned<T>::value && v.is_number_integer() && v.get<int64_t>() < 0 &&
      !v.is_number_unsigned()) {
    throw InvalidArgumentError("\"" + key + "\" must not be negative, got " + v.dump());
  }
  if (!v.is_number()) {
    throw InvalidArgumentError("\"" + key + "\" must be a number, got " + v.dump());
  }
  if (std::is_integral<T>::value && !v.is_number_integer()) {
    throw InvalidArgumentError("\"" + key + "\" must be an integer, got " + v.dump());
  }
  return v.get<T>();
}

// One of `names` (a string), as its value.
template <typename E>
E JsonEnum(const nlohmann::json& v, const std::string& key,
           const std::vector<std::pair<const char*, E>>& names) {
  std::string known;
  for (const auto& [name, value] : names) {
    if (v.is_string() && v.get<std::string>() == name) return value;
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  throw InvalidArgumentError("\"" + key + "\" must be one of " + known + ", got " + v.dump());
}

// A copy of `s` that lives until the process ends (one per distinct
// string): what *_from_json puts in an option struct's string fields.
const char* InternString(const std::string& s);

// The caller's options (NULL: defaults), validated and converted.
strategy::FSDP2StrategyOptions ToStrategyOptions(const fsdp2_strategy_options_t* options);
fsdp2_optimizer_options_t ReadOptimizerOptions(const fsdp2_optimizer_options_t* options);
fsdp2_step_options_t ReadStepOptions(const fsdp2_step_options_t* options);
// Also returns the global batch size.
std::pair<strategy::TokenDatasetOptions, int64_t> ToTokenDatasetOptions(
    const fsdp2_token_loader_options_t* options);

}  // namespace c_api
}  // namespace fsdp2

#endif  // FSDP2_C_API_INTERNAL_OPTIONS_H_
