// fsdp2/core/models/builtin_families.h
//
// The model families a program builds from a JSON configuration, each a
// ModelFamily (model_family.h) over core/models' TrainingModules:
//  - "gpt": GPTModule; batch {tokens [B,T], targets [B,T]} of token ids
//    (int64, int32 or uint8) below vocab_size and T <= block_size; loss the
//    mean next-token cross-entropy; prediction the logits [B,T,vocab_size]
//    as float32.
//  - "mlp": MLPModule; batch {x [B,in] floating-point of any precision,
//    y [B,out] floating-point (mean squared error) or [B] class indices in
//    [0, out) (cross-entropy)}; prediction [B,out] float32.
//  - "hf": a Hugging Face Llama, Mistral or Qwen2 checkpoint directory
//    through LlamaModule, whose weights FSDP2Strategy::parallelize() loads
//    (strategy::HfModel); batch and prediction as for "gpt".
// The configurations, their keys and defaults are the C ABI's
// (fsdp2_model_create in c_api/fsdp2.h documents them).
#ifndef FSDP2_CORE_MODELS_BUILTIN_FAMILIES_H_
#define FSDP2_CORE_MODELS_BUILTIN_FAMILIES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "core/models/model_family.h"

namespace fsdp2 {
namespace models {

// Builds the family a JSON configuration names, e.g.
//   {"family": "gpt", "vocab_size": 256, "n_layer": 2}
// Omitted sizes take GPTConfig's / MLPConfig's defaults. Throws
// InvalidArgumentError for bad JSON, an unknown family or key, or a value
// out of range, naming the key; for "hf", the checkpoint's errors
// (LoadHfConfig, LlamaModule). A configuration whose parameters cannot fit
// is refused before anything is built (InvalidArgumentError naming the
// field and the bytes; model_size.h): the parameters, divided over
// `shards` ranks, must fit in MachineMemoryBytes(). `shards` is 1 for a
// model built whole; for a deferred build, the ranks that will each keep
// their part (the world size). The parameters come from the default
// generator (under a DeferredInitGuard they are deferred).
std::shared_ptr<ModelFamily> CreateModelFamily(const std::string& config_json,
                                               int64_t shards = 1);

}  // namespace models
}  // namespace fsdp2

#endif  // FSDP2_CORE_MODELS_BUILTIN_FAMILIES_H_
