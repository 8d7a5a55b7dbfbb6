// Saving Hugging Face checkpoints (hf_checkpoint.h).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "core/checkpoint/hf_checkpoint.h"
#include "core/checkpoint/internal/param_layout.h"
#include "core/checkpoint/internal/shared_error.h"
#include "core/checkpoint/internal/swap.h"
#include "core/checkpoint/safetensors.h"
#include "core/common/error.h"

namespace fsdp2 {
namespace checkpoint {
namespace fs = std::filesystem;

namespace {

struct Entry {
  const internal::ParamLayout* layout;
  at::ScalarType dtype;
  int64_t bytes;
  std::string saved_name;  // the name in the file
};

// transformers' (huggingface_hub's) split: in state-dict order, a tensor
// larger than the maximum gets a shard of its own (placed before the shard
// being filled); otherwise a shard is closed when the tensor would take it
// past the maximum.
std::vector<std::vector<Entry>> PlanShards(const std::vector<Entry>& entries, int64_t max_bytes) {
  std::vector<std::vector<Entry>> shards;
  std::vector<Entry> current;
  int64_t current_bytes = 0;
  for (const Entry& e : entries) {
    if (e.bytes > max_bytes) {
      shards.push_back({e});
      continue;
    }
    if (!current.empty() && current_bytes + e.bytes > max_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(e);
    current_bytes += e.bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string ShardName(const std::string& stem, size_t i, size_t n) {
  if (n == 1) return stem + ".safetensors";
  char name[64];
  std::snprintf(name, sizeof(name), "-%05zu-of-%05zu.safetensors", i + 1, n);
  return stem + name;
}

// The tokenizer's and generation's files a save copies along.
const char* const kCompanionFiles[] = {
    "tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json",
    "tokenizer.model",    "vocab.json",            "merges.txt",
    "added_tokens.json",  "chat_template.jinja",   "chat_template.json",
    "generation_config.json"};

// The files a Hugging Face save writes (and may replace).
bool IsHfFile(const std::string& name) {
  static const std::regex shard("model(-[0-9]+-of-[0-9]+)?\\.safetensors");
  for (const char* companion : kCompanionFiles) {
    if (name == companion) return true;
  }
  return name == "config.json" || name == "model.safetensors.index.json" ||
         name == "adapter_config.json" || name == "adapter_model.safetensors" ||
         std::regex_match(name, shard);
}

// Rank 0: a fresh DIR.tmp, after checking that DIR holds nothing but an
// earlier save's files.
std::string BeginHfSave(const std::string& dir) {
  if (dir.empty()) throw IoError("Hugging Face save: an empty path");
  internal::RecoverInterruptedSwap(dir);
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) {
      throw IoError(dir + ": exists and is a file; a Hugging Face checkpoint is a directory");
    }
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file() || !IsHfFile(name)) {
        throw IoError(dir + ": holds '" + name +
                      "', which a Hugging Face save does not write; the save replaces the "
                      "directory: choose a new or empty directory (copy tokenizer files in "
                      "after saving)");
      }
    }
  }
  const std::string tmp = dir + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  return tmp;
}

}  // namespace

std::vector<std::string> HfCompanionFiles(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const char* name : kCompanionFiles) {
    const fs::path p = fs::path(dir) / name;
    if (fs::is_regular_file(p, ec)) found.push_back(p.string());
  }
  return found;
}

int64_t ParseShardSize(const std::string& text) {
  static const std::regex form("\\s*([0-9]+)\\s*([KMG]I?B)?\\s*");
  std::string upper = text;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  std::smatch m;
  if (!std::regex_match(upper, m, form)) {
    throw InvalidArgumentError("max_shard_size \"" + text +
                               "\": expected bytes or a size like \"5GB\", \"500MB\", \"2GiB\"");
  }
  int64_t n = std::stoll(m[1].str());
  const std::string unit = m[2].str();
  const int64_t scale = unit == "KB"    ? 1000
                        : unit == "MB"  ? 1000 * 1000
                        : unit == "GB"  ? 1000 * 1000 * 1000
                        : unit == "KIB" ? 1024
                        : unit == "MIB" ? 1024 * 1024
                        : unit == "GIB" ? 1024 * 1024 * 1024
                                        : 1;
  if (n < 1) throw InvalidArgumentError("max_shard_size \"" + text + "\" must be positive");
  return n * scale;
}

void SaveHfWeights(const std::string& dir, torch::nn::Module& root,
                   const std::string& config_json, const HfSaveOptions& options,
                   comm::World& world) {
  if (options.max_shard_bytes < 1) {
    throw InvalidArgumentError("Hugging Face save: max_shard_bytes must be positive");
  }
  const auto layouts = internal::ParamLayouts(root, world.rank());
  std::map<std::string, const internal::ParamLayout*> by_name;
  std::vector<Entry> entries;
  for (const auto& l : layouts) {
    by_name[l.shard.name] = &l;
    const std::string saved = options.rename ? options.rename(l.shard.name) : l.shard.name;
    if (saved.empty()) continue;
    const at::ScalarType type = options.dtype.value_or(l.shard.shard.scalar_type());
    entries.push_back({&l, type,
                       static_cast<int64_t>(c10::multiply_integers(l.full_shape) *
                                            c10::elementSize(type)),
                       saved});
  }
  const GatherParameter gather = [&](const std::string& name) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) throw InternalError("Hugging Face save: no parameter " + name);
    return internal::GatherFull(*it->second, it->second->shard.shard.detach());
  };
  // PEFT's adapters are one file.
  const int64_t max_shard_bytes = options.weights_name == "model"
                                      ? options.max_shard_bytes
                                      : std::numeric_limits<int64_t>::max();
  const auto shards = PlanShards(entries, max_shard_bytes);
  std::string error, tmp;
  if (world.rank() == 0) {
    try {
      tmp = BeginHfSave(dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  internal::ShareRank0Error(error, world, dir + ": rank 0 cannot save there");
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total_size = 0, total_parameters = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = ShardName(options.weights_name, i, shards.size());
    std::unique_ptr<SafetensorsStreamWriter> writer;
    if (world.rank() == 0 && error.empty()) {
      std::vector<SafetensorsStreamWriter::Spec> specs;
      for (const Entry& e : shards[i]) {
        specs.push_back({e.saved_name, e.dtype, e.layout->full_shape});
        weight_map[e.saved_name] = name;
        total_size += e.bytes;
        total_parameters += c10::multiply_integers(e.layout->full_shape);
      }
      try {
        writer = std::make_unique<SafetensorsStreamWriter>((fs::path(tmp) / name).string(),
                                                           specs,
                                                           std::map<std::string, std::string>{
                                                               {"format", "pt"}});
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    for (const Entry& e : shards[i]) {
      // Every rank takes part in every gather, whatever rank 0's state.
      at::Tensor full = internal::GatherFull(*e.layout, e.layout->shard.shard.detach());
      if (options.transform) full = options.transform(e.layout->shard.name, full, gather);
      if (!writer) continue;
      try {
        writer->write(full.to(at::kCPU).to(e.dtype).contiguous());
      } catch (const std::exception& ex) {
        error = ex.what();
        writer.reset();
      }
    }
    if (writer) {
      try {
        writer->commit();
      } catch (const std::exception& ex) {
        error = ex.what();
      }
    }
  }
  if (world.rank() == 0 && error.empty()) {
    try {
      if (shards.size() > 1) {
        nlohmann::json index = {
            {"metadata", {{"total_parameters", total_parameters}, {"total_size", total_size}}},
            {"weight_map", weight_map}};
        WriteFileAtomically((fs::path(tmp) / (options.weights_name + ".safetensors.index.json"))
                                .string(),
                            index.dump(2) + "\n");
      }
      // Copied first, so that a file written here wins over a copy.
      for (const std::string& from : options.copy_files) {
        std::error_code ec;
        if (!fs::is_regular_file(from, ec)) continue;
        fs::copy_file(from, fs::path(tmp) / fs::path(from).filename(),
                      fs::copy_options::overwrite_existing);
      }
      if (!config_json.empty()) {
        WriteFileAtomically((fs::path(tmp) / "config.json").string(), config_json);
      }
      for (const auto& [file, text] : options.files) {
        WriteFileAtomically((fs::path(tmp) / file).string(), text);
      }
      internal::CommitSave(dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (world.rank() == 0 && !error.empty() && !tmp.empty()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // the previous save, if any, stays as it was
  }
  internal::ShareRank0Error(error, world, dir + ": rank 0 could not save the checkpoint");
}

}  // namespace checkpoint
}  // namespace fsdp2
