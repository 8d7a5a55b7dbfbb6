// fsdp2/core/common/enum_names.h
//
// An enumeration's names are written once, in a ToString function next to
// it; this parser reads them back with one message for every option that
// takes one of a few names (the backend, the checkpoint format, the
// sharding strategy, ...):
//
//   Backend b = ParseEnumName("mpi", AllBackends(), ToString, "backend");
//   // InvalidArgumentError: unknown backend "mpi": backend must be one of gloo, nccl
#ifndef FSDP2_CORE_COMMON_ENUM_NAMES_H_
#define FSDP2_CORE_COMMON_ENUM_NAMES_H_

#include <string>
#include <vector>

#include "core/common/error.h"

namespace fsdp2 {

// "a, b, c": the names of `values`, in order.
template <typename E, typename Name>
std::string EnumNameList(const std::vector<E>& values, Name name) {
  std::string list;
  for (const E& value : values) list += (list.empty() ? "" : ", ") + std::string(name(value));
  return list;
}

// The value of `values` whose name(value) is exactly `text`. Throws
// InvalidArgumentError naming `key` (an option's name, e.g.
// "checkpoint_format") and the accepted names otherwise.
template <typename E, typename Name>
E ParseEnumName(const std::string& text, const std::vector<E>& values, Name name,
                const std::string& key) {
  for (const E& value : values) {
    if (text == name(value)) return value;
  }
  std::string words = key;
  for (char& c : words) c = c == '_' ? ' ' : c;
  throw InvalidArgumentError("unknown " + words + " \"" + text + "\": " + key +
                             " must be one of " + EnumNameList(values, name));
}

}  // namespace fsdp2

#endif  // FSDP2_CORE_COMMON_ENUM_NAMES_H_
