// Loading Hugging Face checkpoints row by row (hf_checkpoint.h).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/checkpoint/hf_checkpoint.h"
#include "core/checkpoint/internal/param_layout.h"
#include "core/checkpoint/internal/shared_error.h"
#include "core/checkpoint/safetensors.h"
#include "core/common/error.h"

namespace fsdp2 {
namespace checkpoint {
namespace fs = std::filesystem;

namespace {

constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

bool Loadable(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf || t == at::kDouble;
}

std::string Shape(const std::vector<int64_t>& shape) {
  return c10::str(at::IntArrayRef(shape));
}

HfWeights FromIndex(const std::string& index_path) {
  std::ifstream in(index_path);
  if (!in) throw IoError(index_path + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const std::exception& e) {
    throw IoError(index_path + ": not JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    throw IoError(index_path + ": has no \"weight_map\" object; not a safetensors index");
  }
  HfWeights w;
  w.dir = fs::path(index_path).parent_path().string();
  if (w.dir.empty()) w.dir = ".";
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      throw IoError(index_path + ": weight_map[\"" + name + "\"] is not a file name");
    }
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      throw IoError(index_path + ": weight_map[\"" + name + "\"] = \"" + f +
                    "\" is not a file name in the checkpoint's directory");
    }
    w.file_of[name] = (fs::path(w.dir) / f).string();
  }
  return w;
}

HfWeights FromFile(const std::string& path) {
  HfWeights w;
  w.dir = fs::path(path).parent_path().string();
  const SafetensorsFile f(path);
  for (const auto& item : f.tensors()) w.file_of[item.first] = path;
  return w;
}

// Rows of one parameter from its file, converted to `like`'s dtype.
at::Tensor ReadLocal(const SafetensorsFile& f, const std::string& name,
                     const internal::ParamLayout& l) {
  const fsdp::ShardInfo& s = l.shard;
  const at::ScalarType type = s.shard.scalar_type();
  if (l.tp || l.full_shape.empty()) {
    // A tensor-parallel block, or a 0-d parameter: from the whole tensor.
    return internal::LocalOfFull(l, f.load(name).to(type));
  }
  return f.load_rows(name, s.row_start, s.local_rows).to(type).reshape(s.shard.sizes());
}

}  // namespace

bool IsHfCheckpoint(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return fs::exists(fs::path(path) / kSingle, ec) || fs::exists(fs::path(path) / kIndex, ec);
  }
  const std::string name = fs::path(path).filename().string();
  return name.size() > 11 && name.compare(name.size() - 11, 11, ".index.json") == 0 &&
         fs::is_regular_file(path, ec);
}

HfWeights ResolveHfWeights(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / kIndex, ec)) return FromIndex((dir / kIndex).string());
    if (fs::exists(dir / kSingle, ec)) return FromFile((dir / kSingle).string());
    std::string why = path + ": no " + kSingle + " and no " + kIndex;
    if (fs::exists(dir / "pytorch_model.bin", ec) ||
        fs::exists(dir / "pytorch_model.bin.index.json", ec)) {
      why += " (it has pytorch_model.bin: pickled weights are not read; convert them with "
             "transformers: from_pretrained(dir).save_pretrained(out) writes safetensors)";
    }
    throw NotFoundError(why);
  }
  if (!fs::exists(path, ec)) throw NotFoundError(path + ": no such checkpoint");
  const std::string name = fs::path(path).filename().string();
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) return FromIndex(path);
  return FromFile(path);
}

void LoadHfWeights(const std::string& path, torch::nn::Module& root, comm::World& world,
                   const std::function<bool(const std::string& name)>& keep) {
  auto layouts = internal::ParamLayouts(root, world.rank());
  if (keep) {
    layouts.erase(std::remove_if(layouts.begin(), layouts.end(),
                                 [&](const auto& l) { return keep(l.shard.name); }),
                  layouts.end());
  }
  // Every rank checks the headers (the same files, the same verdict), then
  // all agree before anything is written.
  std::string error;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files;  // by path
  HfWeights w;
  try {
    w = ResolveHfWeights(path);
    std::set<std::string> wanted;
    for (const auto& l : layouts) {
      const std::string& name = l.shard.name;
      wanted.insert(name);
      auto where = w.file_of.find(name);
      if (where == w.file_of.end()) {
        throw IoError("Hugging Face checkpoint " + path + " has no tensor '" + name +
                      "', which the model has");
      }
      auto& f = files[where->second];
      if (!f) f = std::make_shared<SafetensorsFile>(where->second);
      if (!f->contains(name)) {
        throw IoError(where->second + ": has no tensor '" + name +
                      "', though the checkpoint's index puts it there");
      }
      const TensorInfo& info = f->info(name);
      if (info.shape != l.full_shape) {
        throw IoError(where->second + ": tensor '" + name + "' has shape " + Shape(info.shape) +
                      " but the model's parameter is " + Shape(l.full_shape));
      }
      if (!Loadable(info.dtype)) {
        throw IoError(where->second + ": tensor '" + name + "' is " +
                      c10::toString(info.dtype) +
                      "; parameters load from F64, F32, F16 or BF16 tensors");
      }
    }
    for (const auto& [name, file] : w.file_of) {
      if (wanted.count(name) == 0) {
        std::string why = "Hugging Face checkpoint " + path + " has tensor '" + name + "' (in " +
                          fs::path(file).filename().string() + "), which the model does not have";
        if (name == "lm_head.weight") {
          why += " (the config ties the LM head to the embedding: tie_word_embeddings is true)";
        }
        throw IoError(why);
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (const std::optional<int> failed = internal::FailedRank(error, world)) {
    throw IoError(!error.empty() ? error
                                 : "rank " + std::to_string(*failed) +
                                       " rejected Hugging Face checkpoint " + path +
                                       " (see its error)");
  }
  std::string read_error;
  try {
    at::NoGradGuard no_grad;
    for (const auto& l : layouts) {
      const fsdp::ShardInfo& s = l.shard;
      const SafetensorsFile& f = *files.at(w.file_of.at(s.name));
      if (s.local_rows == 0 && !l.tp) continue;
      if (internal::RowsReadInPlace(l) && f.info(s.name).dtype == s.shard.scalar_type()) {
        f.load_rows_into(s.name, s.row_start, s.local_rows, s.shard.view({s.local_rows, -1}));
      } else {
        s.shard.copy_(ReadLocal(f, s.name, l));
      }
    }
    for (const auto& item : files) item.second->check_unchanged();
  } catch (const std::exception& e) {
    read_error = e.what();
  }
  // A read that fails here leaves parameters partly loaded: every rank says so.
  const std::string partly = "; the model's parameters are partly loaded: load the checkpoint again";
  internal::ThrowIfAnyRankFailed(read_error.empty() ? "" : read_error + partly, world,
                                 path + ": another rank could not read its rows" + partly);
}

}  // namespace checkpoint
}  // namespace fsdp2
