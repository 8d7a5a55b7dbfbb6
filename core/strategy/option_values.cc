// The option table's values (option_table.h): parsing and checking a
// value against its row, the flags' text, the schema. The rows are in
// option_table.cc.
#include "core/strategy/option_table.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>

#include "core/common/enum_names.h"
#include "core/common/error.h"

namespace fsdp2 {
namespace strategy {
namespace {

using nlohmann::json;

[[noreturn]] void Refuse(const OptionSpec& spec, const std::string& what, const json& value) {
  throw InvalidArgumentError("\"" + spec.name + "\" must be " + what + ", got " + value.dump());
}

// The range check of a number, in the words of the row.
void CheckRange(const OptionSpec& spec, double v, const std::string& shown) {
  const bool below = spec.min_exclusive ? !(v > spec.min) : !(v >= spec.min);
  const bool above = spec.max_exclusive ? !(v < spec.max) : !(v <= spec.max);
  if (below || above || std::isnan(v)) {
    throw InvalidArgumentError(spec.name + " must be " + spec.requirement + ", got " + shown);
  }
}

std::string Shown(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

json ParseInt(const OptionSpec& spec, const json& v) {
  if (!v.is_number()) Refuse(spec, "a number", v);
  if (!v.is_number_integer()) Refuse(spec, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) {
    throw InvalidArgumentError(spec.name + " must be " + spec.requirement + ", got " + v.dump());
  }
  const int64_t i = v.get<int64_t>();
  CheckRange(spec, static_cast<double>(i), std::to_string(i));
  return json(i);
}

}  // namespace

const char* ToString(OptionType type) {
  switch (type) {
    case OptionType::kBool: return "bool";
    case OptionType::kInt: return "int";
    case OptionType::kUInt64: return "uint64";
    case OptionType::kNumber: return "number";
    case OptionType::kChoice: return "choice";
    case OptionType::kSize: return "size";
    case OptionType::kText: return "text";
  }
  return "?";
}

json ParseOption(const OptionSpec& spec, const json& given) {
  const json v = spec.normalize ? spec.normalize(given) : given;
  json out;
  switch (spec.type) {
    case OptionType::kBool:
      if (v.is_boolean()) {
        out = v;
      } else if (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1)) {
        out = v.get<int64_t>() == 1;
      } else {
        Refuse(spec, "true or false", v);
      }
      break;
    case OptionType::kInt:
      out = ParseInt(spec, v);
      break;
    case OptionType::kUInt64:
      if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0) {
        Refuse(spec, "0 or more", v);
      }
      if (!v.is_number()) Refuse(spec, "a number", v);
      if (!v.is_number_integer()) Refuse(spec, "an integer", v);
      out = v.get<uint64_t>();
      break;
    case OptionType::kNumber: {
      if (!v.is_number()) Refuse(spec, "a number", v);
      const double d = v.get<double>();
      if (!std::isfinite(d)) {
        throw InvalidArgumentError(spec.name + " must be " + spec.requirement + ", got " + Shown(d));
      }
      CheckRange(spec, d, Shown(d));
      out = d;
      break;
    }
    case OptionType::kChoice:
      out = ParseEnumName(v.is_string() ? v.get<std::string>() : v.dump(), spec.choices,
                          [](const std::string& name) { return name; }, spec.name);
      break;
    case OptionType::kSize:
      if (v.is_string() && v.get<std::string>() == "auto") {
        out = "auto";
      } else if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) &&
                 v.get<int64_t>() >= spec.min && v.get<int64_t>() <= spec.max) {
        out = v.get<int64_t>();
      } else {
        Refuse(spec, "\"auto\" or " + spec.requirement, v);
      }
      break;
    case OptionType::kText:
      if (!v.is_null() && !v.is_string()) Refuse(spec, "a string", v);
      out = v;
      break;
  }
  if (spec.check) spec.check(out);
  return out;
}

json ParseOptionText(const OptionSpec& spec, const std::string& text) {
  auto integer = [&]() -> json {
    char* end = nullptr;
    errno = 0;
    if (!text.empty() && text[0] != '-') {
      const unsigned long long u = std::strtoull(text.c_str(), &end, 10);
      if (end != nullptr && *end == '\0' && errno == 0) return json(static_cast<uint64_t>(u));
    } else if (!text.empty()) {
      const long long i = std::strtoll(text.c_str(), &end, 10);
      if (end != nullptr && *end == '\0' && errno == 0) return json(static_cast<int64_t>(i));
    }
    throw InvalidArgumentError("\"" + spec.name + "\" must be an integer, got '" + text + "'");
  };
  switch (spec.type) {
    case OptionType::kBool:
      if (text == "1" || text == "true") return ParseOption(spec, true);
      if (text == "0" || text == "false") return ParseOption(spec, false);
      throw InvalidArgumentError("\"" + spec.name + "\" must be 1 or 0 (true or false), got '" +
                                 text + "'");
    case OptionType::kInt:
    case OptionType::kUInt64:
      return ParseOption(spec, integer());
    case OptionType::kSize:
      return ParseOption(spec, text == "auto" ? json("auto") : integer());
    case OptionType::kNumber: {
      char* end = nullptr;
      const double d = std::strtod(text.c_str(), &end);
      if (text.empty() || end == nullptr || *end != '\0') {
        throw InvalidArgumentError("\"" + spec.name + "\" must be a number, got '" + text + "'");
      }
      return ParseOption(spec, d);
    }
    case OptionType::kChoice:
      return ParseOption(spec, text);
    case OptionType::kText:
      return ParseOption(spec, text.empty() ? json() : json(text));
  }
  return json();
}

std::string OptionText(const json& value) {
  if (value.is_null()) return "";
  if (value.is_boolean()) return value.get<bool>() ? "1" : "0";
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) return Shown(value.get<double>());
  return value.dump();
}

namespace {

template <typename Target>
json RowsJson(const OptionTable<Target>& table) {
  json rows = json::array();
  for (const OptionSpec& r : table) {
    json row = {{"name", r.name},
                {"cpp", r.cpp},
                {"type", ToString(r.type)},
                {"default", r.default_value},
                {"doc", r.doc}};
    if (!r.choices.empty()) row["choices"] = r.choices;
    if (std::isfinite(r.min)) row["min"] = r.min;
    if (std::isfinite(r.max)) row["max"] = r.max;
    if (r.min_exclusive) row["min_exclusive"] = true;
    if (r.max_exclusive) row["max_exclusive"] = true;
    if (!r.requirement.empty()) row["requirement"] = r.requirement;
    row["flag"] = r.flag;
    if (!r.flag.empty()) {
      row["flag_default"] = r.flag_default.is_null() ? r.default_value : r.flag_default;
    }
    if (!r.flag_note.empty()) row["flag_note"] = r.flag_note;
    if (!r.see.empty()) row["see"] = r.see;
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

const json& OptionSchema() {
  static const json* schema = new json{{"strategy", RowsJson(StrategyOptionTable())},
                                       {"optimizer", RowsJson(OptimizerOptionTable())},
                                       {"step", RowsJson(StepOptionTable())}};
  return *schema;
}

}  // namespace strategy
}  // namespace fsdp2
