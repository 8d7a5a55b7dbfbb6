#include "core/strategy/option_enums.h"

#include "core/common/enum_names.h"

namespace fsdp2 {
namespace strategy {

const std::vector<CheckpointFormat>& AllCheckpointFormats() {
  static const std::vector<CheckpointFormat> all = {CheckpointFormat::kSharded,
                                                    CheckpointFormat::kFull};
  return all;
}

const char* ToString(CheckpointFormat format) {
  switch (format) {
    case CheckpointFormat::kSharded: return "sharded";
    case CheckpointFormat::kFull: return "full";
  }
  return "?";
}

CheckpointFormat ParseCheckpointFormat(const std::string& name) {
  return ParseEnumName(name, AllCheckpointFormats(),
                       [](CheckpointFormat f) { return ToString(f); }, "checkpoint_format");
}

const std::vector<GradientAccumulation>& AllGradientAccumulations() {
  static const std::vector<GradientAccumulation> all = {GradientAccumulation::kLocal,
                                                        GradientAccumulation::kSharded};
  return all;
}

const char* ToString(GradientAccumulation mode) {
  switch (mode) {
    case GradientAccumulation::kLocal: return "local";
    case GradientAccumulation::kSharded: return "sharded";
  }
  return "?";
}

}  // namespace strategy
}  // namespace fsdp2
