// fsdp2/core/strategy/option_enums.h
//
// FSDP2StrategyOptions' choices that are names on the way in (JSON, flags,
// Python and Java strings) and typed values inside the core: each
// enumeration with its names, written once here and read back by
// ParseEnumName (core/common/enum_names.h) through the option table. The
// backend is comm::Backend (core/comm/backend.h), the device DeviceSpec
// (device.h).
#ifndef FSDP2_CORE_STRATEGY_OPTION_ENUMS_H_
#define FSDP2_CORE_STRATEGY_OPTION_ENUMS_H_

#include <string>
#include <vector>

namespace fsdp2 {
namespace strategy {

// What save_checkpoint() writes (FSDP2StrategyOptions::checkpoint_format);
// the target is a directory in both, and load_checkpoint() reads either.
enum class CheckpointFormat {
  kSharded,  // every rank writes its rows: DIR/rank<r>-of-<N>.safetensors, DIR/metadata.json
  kFull,     // rank 0 writes one safetensors file, DIR/checkpoint.safetensors
};
// Both formats, in the order of the C ABI's fsdp2_checkpoint_format_t codes.
const std::vector<CheckpointFormat>& AllCheckpointFormats();
// "sharded" or "full" (static storage): the name every front end uses.
const char* ToString(CheckpointFormat format);
// The format named `name`; InvalidArgumentError naming both otherwise.
CheckpointFormat ParseCheckpointFormat(const std::string& name);

// How micro-batches that do not sync gradients accumulate them
// (FSDP2StrategyOptions::gradient_accumulation).
enum class GradientAccumulation {
  kLocal,    // keep unsharded gradients; communicate at the last micro-batch
  kSharded,  // reduce-scatter each micro-batch; all-reduce across replicas at the last
};
// Both modes, in the order of the C ABI's fsdp2_gradient_accumulation_t codes.
const std::vector<GradientAccumulation>& AllGradientAccumulations();
// "local" or "sharded" (static storage): the name every front end uses.
const char* ToString(GradientAccumulation mode);

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_OPTION_ENUMS_H_
