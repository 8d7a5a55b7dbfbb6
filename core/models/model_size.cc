#include "core/models/model_size.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <utility>
#include <vector>

#include "core/common/error.h"

namespace fsdp2 {
namespace models {
namespace {

// A Linear layer's weight and optional bias.
void AddLinear(ParameterFootprint& f, double in, double out, bool bias = true) {
  f.elements += in * out + (bias ? out : 0);
  f.tensors += bias ? 2 : 1;
}

// A norm layer's weight and optional bias.
void AddNorm(ParameterFootprint& f, double size, bool bias) {
  f.elements += size * (bias ? 2 : 1);
  f.tensors += bias ? 2 : 1;
}

// The number in a cgroup file ("max" or absent: none).
double CgroupLimit(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return 0;
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    return 0;
  }
}

// Which of `fields` weighs most: the one whose value, set to 1, leaves the
// smallest model (`footprint_of` computes a model with one field changed).
std::string HeaviestField(
    const std::vector<std::pair<std::string, int64_t>>& fields,
    const std::function<double(const std::string&)>& bytes_with_field_one) {
  std::string heaviest;
  double smallest = 0;
  for (const auto& [name, value] : fields) {
    if (value <= 1) continue;
    const double bytes = bytes_with_field_one(name);
    if (heaviest.empty() || bytes < smallest) {
      heaviest = name;
      smallest = bytes;
    }
  }
  return heaviest;
}

const char* DtypeName(double element_bytes) {
  return element_bytes == 2 ? "bfloat16/float16" : element_bytes == 8 ? "float64" : "float32";
}

void Require(const std::string& where, const std::vector<std::pair<std::string, int64_t>>& fields,
             const std::function<ParameterFootprint(const std::string&)>& with_field_one,
             const ParameterFootprint& f, int64_t shards, int64_t memory_bytes) {
  // Every rank builds every module; each keeps 1/shards of the elements.
  const double divide = static_cast<double>(std::max<int64_t>(shards, 1));
  auto per_rank = [&](const ParameterFootprint& p) {
    return p.elements * p.element_bytes / divide + p.tensors * kBytesPerParameterTensor;
  };
  const double needed = per_rank(f);
  if (needed <= static_cast<double>(memory_bytes)) return;
  const std::string field = HeaviestField(
      fields, [&](const std::string& name) { return per_rank(with_field_one(name)); });
  int64_t value = 0;
  for (const auto& item : fields) {
    if (item.first == field) value = item.second;
  }
  std::ostringstream msg;
  msg.precision(3);
  msg << where << ": ";
  if (!field.empty()) msg << "\"" << field << "\" = " << value << " makes ";
  msg << f.elements << " parameters (" << FormatBytes(f.elements * f.element_bytes) << " in "
      << DtypeName(f.element_bytes);
  if (shards > 1) msg << ", " << FormatBytes(needed) << " on each of " << shards << " ranks";
  msg << "), more than the " << FormatBytes(static_cast<double>(memory_bytes))
      << " of memory this machine has";
  if (!field.empty()) msg << "; make \"" << field << "\" smaller";
  throw InvalidArgumentError(msg.str());
}

}  // namespace

double ParameterFootprint::bytes() const {
  return elements * element_bytes + tensors * kBytesPerParameterTensor;
}

ParameterFootprint GptFootprint(const GPTConfig& c) {
  const double C = static_cast<double>(c.n_embd);
  ParameterFootprint block;  // see GPTConfig::NumParams
  AddNorm(block, C, /*bias=*/true);
  AddLinear(block, C, 3 * C);
  AddLinear(block, C, C);
  AddNorm(block, C, /*bias=*/true);
  AddLinear(block, C, 4 * C);
  AddLinear(block, 4 * C, C);
  ParameterFootprint f;
  f.elements = static_cast<double>(c.vocab_size) * C + static_cast<double>(c.block_size) * C +
               static_cast<double>(c.n_layer) * block.elements;
  f.tensors = 2 + static_cast<double>(c.n_layer) * block.tensors;
  AddNorm(f, C, /*bias=*/true);  // ln_f; the head is tied to wte
  return f;
}

ParameterFootprint MlpFootprint(const MLPConfig& c) {
  const double H = static_cast<double>(c.hidden);
  ParameterFootprint block;  // LayerNorm, Linear(H, 2H), ReLU, Linear(2H, H)
  AddNorm(block, H, /*bias=*/true);
  AddLinear(block, H, 2 * H);
  AddLinear(block, 2 * H, H);
  ParameterFootprint f;
  AddLinear(f, static_cast<double>(c.in_features), H);
  AddLinear(f, H, static_cast<double>(c.out_features));
  f.elements += static_cast<double>(c.depth) * block.elements;
  f.tensors += static_cast<double>(c.depth) * block.tensors;
  return f;
}

ParameterFootprint LlamaFootprint(const HfLlamaConfig& c, at::ScalarType dtype) {
  const double hidden = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(c.num_attention_heads) * static_cast<double>(c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads) * static_cast<double>(c.head_dim);
  const double inter = static_cast<double>(c.intermediate_size);
  ParameterFootprint layer;
  AddLinear(layer, hidden, q, c.qkv_bias);
  AddLinear(layer, hidden, kv, c.qkv_bias);
  AddLinear(layer, hidden, kv, c.qkv_bias);
  AddLinear(layer, q, hidden, c.o_bias);
  AddLinear(layer, hidden, inter, c.mlp_bias);
  AddLinear(layer, hidden, inter, c.mlp_bias);
  AddLinear(layer, inter, hidden, c.mlp_bias);
  AddNorm(layer, hidden, /*bias=*/false);
  AddNorm(layer, hidden, /*bias=*/false);
  ParameterFootprint f;
  const double vocab = static_cast<double>(c.vocab_size);
  f.elements = vocab * hidden * (c.tie_word_embeddings ? 1 : 2) +
               static_cast<double>(c.num_hidden_layers) * layer.elements;
  f.tensors = (c.tie_word_embeddings ? 1 : 2) +
              static_cast<double>(c.num_hidden_layers) * layer.tensors;
  AddNorm(f, hidden, /*bias=*/false);
  f.element_bytes =
      std::max<double>(4, static_cast<double>(c10::elementSize(dtype)));  // built in float32
  return f;
}

int64_t MachineMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  double memory = pages > 0 && page > 0 ? static_cast<double>(pages) * page : 0;
  for (const char* path : {"/sys/fs/cgroup/memory.max",
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const double limit = CgroupLimit(path);
    if (limit > 0 && (memory == 0 || limit < memory)) memory = limit;
  }
  return memory > 0 ? static_cast<int64_t>(std::min(memory, 9.0e18)) : INT64_MAX;
}

std::string FormatBytes(double bytes) {
  static const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  size_t unit = 0;
  while (bytes >= 1000 && unit + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    bytes /= 1000;
    ++unit;
  }
  char text[64];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%.0f B", bytes);
  } else {
    std::snprintf(text, sizeof(text), "%.3g %s", bytes, kUnits[unit]);
  }
  return text;
}

void RequireFits(const std::string& where, const GPTConfig& config, int64_t shards,
                 int64_t memory_bytes) {
  Require(where,
          {{"vocab_size", config.vocab_size},
           {"block_size", config.block_size},
           {"n_layer", config.n_layer},
           {"n_embd", config.n_embd}},
          [&](const std::string& field) {
            GPTConfig c = config;
            if (field == "vocab_size") c.vocab_size = 1;
            if (field == "block_size") c.block_size = 1;
            if (field == "n_layer") c.n_layer = 1;
            if (field == "n_embd") c.n_embd = 1;
            return GptFootprint(c);
          },
          GptFootprint(config), shards, memory_bytes);
}

void RequireFits(const std::string& where, const MLPConfig& config, int64_t shards,
                 int64_t memory_bytes) {
  Require(where,
          {{"in_features", config.in_features},
           {"hidden", config.hidden},
           {"out_features", config.out_features},
           {"depth", config.depth}},
          [&](const std::string& field) {
            MLPConfig c = config;
            if (field == "in_features") c.in_features = 1;
            if (field == "hidden") c.hidden = 1;
            if (field == "out_features") c.out_features = 1;
            if (field == "depth") c.depth = 1;
            return MlpFootprint(c);
          },
          MlpFootprint(config), shards, memory_bytes);
}

void RequireFits(const std::string& where, const HfLlamaConfig& config, at::ScalarType dtype,
                 int64_t shards, int64_t memory_bytes) {
  Require(where,
          {{"vocab_size", config.vocab_size},
           {"hidden_size", config.hidden_size},
           {"intermediate_size", config.intermediate_size},
           {"num_hidden_layers", config.num_hidden_layers},
           {"num_attention_heads", config.num_attention_heads},
           {"num_key_value_heads", config.num_key_value_heads},
           {"head_dim", config.head_dim}},
          [&](const std::string& field) {
            HfLlamaConfig c = config;
            if (field == "vocab_size") c.vocab_size = 1;
            if (field == "hidden_size") c.hidden_size = 1;
            if (field == "intermediate_size") c.intermediate_size = 1;
            if (field == "num_hidden_layers") c.num_hidden_layers = 1;
            if (field == "num_attention_heads") c.num_attention_heads = 1;
            if (field == "num_key_value_heads") c.num_key_value_heads = 1;
            if (field == "head_dim") c.head_dim = 1;
            return LlamaFootprint(c, dtype);
          },
          LlamaFootprint(config, dtype), shards, memory_bytes);
}

}  // namespace models
}  // namespace fsdp2
