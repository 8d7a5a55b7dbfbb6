#include "examples/flags/flags.h"

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace fsdp2 {
namespace flags {

Flags::Flags(int argc, const char* const* argv, std::string usage)
    : usage_(std::move(usage)) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return;
    }
    if (arg.rfind("--", 0) != 0) {
      throw FlagError("unexpected argument '" + arg + "' (see --help)");
    }
    std::string key = arg.substr(2), value;
    const auto eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw FlagError("flag --" + key + " needs a value");
    }
    given_[key] = value;
  }
}

const std::string* Flags::Read(const std::string& name, const std::string& value_kind,
                               const std::string& help, const std::string& default_value) {
  if (read_.insert(name).second) {
    registered_.push_back({name, value_kind, help, default_value});
  }
  if (help_requested_) return nullptr;
  auto it = given_.find(name);
  return it == given_.end() ? nullptr : &it->second;
}

int64_t Flags::Int(const std::string& name, int64_t default_value, const std::string& help) {
  const std::string* value = Read(name, "N", help, std::to_string(default_value));
  if (value == nullptr) return default_value;
  size_t used = 0;
  int64_t result = 0;
  try {
    result = std::stoll(*value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value->size()) {
    throw FlagError("--" + name + " expects an integer, got '" + *value + "'");
  }
  return result;
}

double Flags::Double(const std::string& name, double default_value, const std::string& help) {
  std::ostringstream shown;
  shown << default_value;
  const std::string* value = Read(name, "X", help, shown.str());
  if (value == nullptr) return default_value;
  size_t used = 0;
  double result = 0;
  try {
    result = std::stod(*value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value->size()) {
    throw FlagError("--" + name + " expects a number, got '" + *value + "'");
  }
  return result;
}

std::string Flags::String(const std::string& name, const std::string& default_value,
                          const std::string& help) {
  const std::string* value = Read(name, "VALUE", help, default_value);
  return value == nullptr ? default_value : *value;
}

std::vector<std::string> Flags::StringList(const std::string& name,
                                          const std::vector<std::string>& default_value,
                                          const std::string& help) {
  std::string shown;
  for (const auto& v : default_value) shown += (shown.empty() ? "" : ",") + v;
  const std::string* value = Read(name, "A,B,...", help, shown);
  if (value == nullptr) return default_value;
  std::vector<std::string> result;
  for (size_t start = 0;;) {
    const size_t comma = value->find(',', start);
    const std::string item = value->substr(start, comma - start);
    if (item.empty()) {
      throw FlagError("--" + name + " expects words separated by commas, got '" +
                      *value + "'");
    }
    result.push_back(item);
    if (comma == std::string::npos) return result;
    start = comma + 1;
  }
}

std::vector<int64_t> Flags::IntList(const std::string& name,
                                    const std::vector<int64_t>& default_value,
                                    const std::string& help) {
  std::string shown;
  for (int64_t v : default_value) shown += (shown.empty() ? "" : ",") + std::to_string(v);
  const std::string* value = Read(name, "N,N,...", help, shown);
  if (value == nullptr) return default_value;
  std::vector<int64_t> result;
  for (size_t start = 0;;) {
    const size_t comma = value->find(',', start);
    const std::string item = value->substr(start, comma - start);
    size_t used = 0;
    try {
      result.push_back(std::stoll(item, &used));
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size()) {
      throw FlagError("--" + name + " expects integers separated by commas, got '" +
                      *value + "'");
    }
    if (comma == std::string::npos) return result;
    start = comma + 1;
  }
}

void Flags::Finish() const {
  if (help_requested_) {
    std::cout << Help();
    std::cout.flush();
    std::exit(0);
  }
  for (const auto& [key, value] : given_) {
    if (read_.count(key) == 0) throw FlagError("unknown flag --" + key + " (see --help)");
  }
}

std::string Flags::Help() const {
  std::ostringstream out;
  out << usage_;
  if (!usage_.empty() && usage_.back() != '\n') out << "\n";
  out << "flags (--key value or --key=value):\n";
  for (const auto& flag : registered_) {
    std::string left = "  --" + flag.name + " " + flag.value_kind;
    if (left.size() < 28) left.resize(28, ' ');
    out << left << " " << flag.help;
    if (!flag.default_value.empty()) out << " (default " << flag.default_value << ")";
    out << "\n";
  }
  return out.str();
}

}  // namespace flags
}  // namespace fsdp2
