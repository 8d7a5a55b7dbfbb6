// fsdp2/core/models/model_size.h
//
// What a model configuration's parameters need, computed from the
// configuration alone, before anything is built, and the refusal of a
// configuration whose parameters cannot fit in this machine's memory: a
// model of a billion layers is an error naming the field at once, not
// minutes of building block after block until memory runs out.
//
// The sizes count every parameter tensor once (a tied head once) at the
// dtype the model is built in, plus kBytesPerParameterTensor for each
// tensor's objects (tensor, storage, autograd and module bookkeeping: a
// lower bound, so that a model of very many tiny layers is refused too).
// Arithmetic in double: a configuration of any size gives a finite
// answer, never an overflowed one.
#ifndef FSDP2_CORE_MODELS_MODEL_SIZE_H_
#define FSDP2_CORE_MODELS_MODEL_SIZE_H_

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "core/models/gpt.h"
#include "core/models/hf_config.h"
#include "core/models/mlp.h"

namespace fsdp2 {
namespace models {

// Host bytes each parameter tensor costs beyond its elements (a lower
// bound of what LibTorch and torch::nn::Module keep per tensor).
constexpr double kBytesPerParameterTensor = 512;

struct ParameterFootprint {
  double elements = 0;  // parameter elements, tied ones once
  double tensors = 0;   // parameter tensors
  double element_bytes = 4;
  // elements * element_bytes + tensors * kBytesPerParameterTensor.
  double bytes() const;
};

// The GPT of core/models/gpt.h in float32 (GPTConfig::NumParams without
// overflow).
ParameterFootprint GptFootprint(const GPTConfig& config);
// The MLP of core/models/mlp.h in float32.
ParameterFootprint MlpFootprint(const MLPConfig& config);
// The Llama-family decoder of core/models/llama.h: built in float32, then
// converted to `dtype` (so the larger of the two element sizes).
ParameterFootprint LlamaFootprint(const HfLlamaConfig& config, at::ScalarType dtype);

// The memory this process can use: the machine's physical memory, or the
// limit of its control group (cgroup v2 memory.max, v1
// memory.limit_in_bytes) where that is lower.
int64_t MachineMemoryBytes();

// "13.2 GB" / "512 MB" / "100 B": decimal units, for messages.
std::string FormatBytes(double bytes);

// Each throws InvalidArgumentError unless the model's footprint, divided
// over `shards` ranks that each keep their part (1: a model built whole),
// fits in `memory_bytes` (MachineMemoryBytes()). The message starts with
// `where` (e.g. model "gpt"), names the field whose value weighs most (the
// one that, set to 1, shrinks the model most) and the bytes the model
// needs, e.g.
//   model "gpt": "n_layer" = 1000000000 makes 3.2e+12 parameters (12.7 TB
//   in float32), more than the 25.3 GB of memory this machine has ...
void RequireFits(const std::string& where, const GPTConfig& config, int64_t shards,
                 int64_t memory_bytes);
void RequireFits(const std::string& where, const MLPConfig& config, int64_t shards,
                 int64_t memory_bytes);
void RequireFits(const std::string& where, const HfLlamaConfig& config, at::ScalarType dtype,
                 int64_t shards, int64_t memory_bytes);

}  // namespace models
}  // namespace fsdp2

#endif  // FSDP2_CORE_MODELS_MODEL_SIZE_H_
