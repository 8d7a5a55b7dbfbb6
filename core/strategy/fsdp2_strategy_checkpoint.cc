// fsdp2/core/strategy/fsdp2_strategy_checkpoint.cc
//
// FSDP2Strategy's checkpoints: saving (now or in the background), loading,
// removing and checking a target, and loading a model state dict from a
// safetensors file (see core/checkpoint/); the model's and the optimizer's
// state dicts in memory.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/full_checkpoint.h"
#include "core/checkpoint/hf_checkpoint.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/common/error.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/hf_model.h"
#include "core/tp/state_dict.h"

namespace fsdp2 {
namespace strategy {

void FSDP2Strategy::load_model_state_dict(const std::string& safetensors_path, bool strict) {
  require(true, true, "load_model_state_dict");
  wait_for_host_optimizer();
  if (checkpoint::IsHfCheckpoint(safetensors_path)) {
    checkpoint::LoadHfWeights(safetensors_path, *module_->module(), *world_);
    return;
  }
  std::string file = safetensors_path;
  if (checkpoint::DetectCheckpoint(file) == checkpoint::CheckpointLayout::kFull) {
    file += std::string("/") + checkpoint::kFullCheckpointFile;
  }
  const checkpoint::SafetensorsFile f(file);
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& item : f.tensors()) {
    if (item.first.rfind("optim/", 0) == 0) continue;  // a full checkpoint's optimizer
    state.emplace_back(item.first, f.load(item.first));
  }
  load_model_state_dict(state, strict);
}

namespace {

bool IsLoraName(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos ||
         name.find(".lora_B.") != std::string::npos;
}

// generation_config.json as transformers writes it from a model's config
// (its special token ids), for a source checkpoint that has none.
std::string GenerationConfigJson(const std::string& config_json) {
  const nlohmann::json config = nlohmann::json::parse(config_json);
  nlohmann::json g = {{"_from_model_config", true}};
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (config.contains(key) && !config[key].is_null()) g[key] = config[key];
  }
  if (config.contains("transformers_version")) {
    g["transformers_version"] = config["transformers_version"];
  }
  return g.dump(2) + "\n";
}

// PEFT's adapter_config.json for `lora` over the base checkpoint `base`.
std::string AdapterConfigJson(const HfLora& lora, const std::string& base) {
  const nlohmann::json j = {{"peft_type", "LORA"},
                            {"task_type", "CAUSAL_LM"},
                            {"base_model_name_or_path", base},
                            {"r", lora.rank},
                            {"lora_alpha", lora.alpha},
                            {"lora_dropout", lora.dropout},
                            {"target_modules", lora.target_modules},
                            {"bias", "none"},
                            {"fan_in_fan_out", false},
                            {"inference_mode", true},
                            {"init_lora_weights", true},
                            {"use_rslora", false},
                            {"use_dora", false},
                            {"modules_to_save", nullptr},
                            {"layers_to_transform", nullptr},
                            {"revision", nullptr}};
  return j.dump(2) + "\n";
}

}  // namespace

void FSDP2Strategy::load_hf_weights() {
  const auto* hf = dynamic_cast<const HfModel*>(module_.get());
  if (hf == nullptr || hf->hf_weights_path().empty()) return;
  // LoRA adapters are not in the base checkpoint: they keep their draw.
  std::function<bool(const std::string&)> keep;
  if (hf->hf_lora().rank > 0) keep = IsLoraName;
  checkpoint::LoadHfWeights(hf->hf_weights_path(), *module_->module(), *world_, keep);
}

void FSDP2Strategy::save_hf_checkpoint(const std::string& dir, int64_t max_shard_bytes,
                                       std::optional<at::ScalarType> dtype) {
  save_hf(dir, max_shard_bytes, dtype, /*merged=*/false);
}

void FSDP2Strategy::save_hf_merged_checkpoint(const std::string& dir, int64_t max_shard_bytes,
                                              std::optional<at::ScalarType> dtype) {
  save_hf(dir, max_shard_bytes, dtype, /*merged=*/true);
}

void FSDP2Strategy::save_hf(const std::string& dir, int64_t max_shard_bytes,
                            std::optional<at::ScalarType> dtype, bool merged) {
  const char* what = merged ? "save_hf_merged_checkpoint" : "save_hf_checkpoint";
  require(true, true, what);
  wait_for_host_optimizer();
  const auto* hf = dynamic_cast<const HfModel*>(module_.get());
  if (hf == nullptr) {
    throw InvalidArgumentError(
        std::string("FSDP2Strategy::") + what +
        ": the module is not a Hugging Face model (an HfModel, such as models::LlamaModule): "
        "there is no config.json to save with it; use save_checkpoint");
  }
  checkpoint::HfSaveOptions options;
  options.max_shard_bytes = max_shard_bytes;
  if (dtype) options.dtype = *dtype;
  at::ScalarType config_dtype = at::kFloat;
  for (const auto& p : module_->module()->parameters()) {
    config_dtype = p.scalar_type();
    break;
  }
  std::string config_json = hf->hf_config_json(dtype.value_or(config_dtype));
  // The source's tokenizer and generation config travel with the weights.
  std::string source = hf->hf_weights_path();
  if (!source.empty() && !std::filesystem::is_directory(source)) {
    source = std::filesystem::path(source).parent_path().string();
  }
  if (!source.empty()) options.copy_files = checkpoint::HfCompanionFiles(source);
  const bool has_generation_config = std::any_of(
      options.copy_files.begin(), options.copy_files.end(), [](const std::string& f) {
        return std::filesystem::path(f).filename() == "generation_config.json";
      });
  if (!has_generation_config) {
    options.files["generation_config.json"] = GenerationConfigJson(config_json);
  }
  const HfLora lora = hf->hf_lora();
  if (lora.rank > 0 && !merged) {
    // PEFT's layout: only the adapters, named from PeftModel's root.
    options.weights_name = "adapter_model";
    options.rename = [](const std::string& name) {
      return IsLoraName(name) ? "base_model.model." + name : std::string();
    };
    const std::string base =
        source.empty() ? std::string() : std::filesystem::absolute(source).string();
    options.files["adapter_config.json"] = AdapterConfigJson(lora, base);
    config_json.clear();  // the base checkpoint's config.json applies
  } else if (lora.rank > 0) {
    const double scaling = lora.alpha / static_cast<double>(lora.rank);
    options.rename = [](const std::string& name) {
      return IsLoraName(name) ? std::string() : name;
    };
    // W + scaling * B A where the projection has adapters.
    std::set<std::string> adapted;
    for (const auto& item : module_->module()->named_parameters()) {
      const std::string& name = item.key();
      const auto at = name.find(".lora_A.weight");
      if (at != std::string::npos) adapted.insert(name.substr(0, at) + ".weight");
    }
    options.transform = [adapted, scaling](const std::string& name, const at::Tensor& full,
                                           const checkpoint::GatherParameter& gather) {
      if (adapted.count(name) == 0) return full;
      const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
      const at::Tensor a = gather(stem + ".lora_A.weight").to(at::kFloat);
      const at::Tensor b = gather(stem + ".lora_B.weight").to(at::kFloat);
      return (full.to(at::kFloat) + at::matmul(b, a) * scaling).to(full.scalar_type());
    };
  }
  checkpoint::SaveHfWeights(dir, *module_->module(), config_json, options, *world_);
}

void FSDP2Strategy::save_checkpoint(const std::string& path, bool async) {
  require_optimizer("save_checkpoint");
  wait_for_host_optimizer();
  wait_for_checkpoint();  // at most one save in flight
  const std::map<std::string, std::string> progress = {
      {"epoch", std::to_string(epoch_)}, {"global_step", std::to_string(global_step_)}};
  if (async) {
    auto write = options_.checkpoint_format == CheckpointFormat::kFull
                     ? checkpoint::StageFullCheckpoint(path, *module_->module(), optimizer_.get(),
                                                       *world_, progress)
                     : checkpoint::StageShardedCheckpoint(path, *module_->module(),
                                                          optimizer_.get(), *world_, progress,
                                                          options_.timeout);
    if (!saver_) saver_ = std::make_unique<checkpoint::BackgroundSaver>();
    saver_->start(std::move(write));
  } else if (options_.checkpoint_format == CheckpointFormat::kFull) {
    checkpoint::SaveFullCheckpoint(path, *module_->module(), optimizer_.get(), *world_, progress);
  } else {
    checkpoint::SaveShardedCheckpoint(path, *module_->module(), optimizer_.get(), *world_,
                                      progress);
  }
}

void FSDP2Strategy::wait_for_checkpoint() {
  if (saver_) saver_->wait();
}

bool FSDP2Strategy::checkpoint_in_flight() const { return saver_ && saver_->in_flight(); }

void FSDP2Strategy::load_checkpoint(const std::string& path) {
  require_optimizer("load_checkpoint");
  wait_for_host_optimizer();
  wait_for_checkpoint();
  const auto layout = checkpoint::DetectCheckpoint(path);
  const bool sharded = layout == checkpoint::CheckpointLayout::kSharded ||
                       layout == checkpoint::CheckpointLayout::kNone;
  auto progress =
      sharded ? checkpoint::LoadShardedCheckpoint(path, *module_->module(), optimizer_.get(), *world_)
              : checkpoint::LoadFullCheckpoint(path, *module_->module(), optimizer_.get(), *world_);
  pending_optimizer_state_.reset();  // the checkpoint's state wins
  epoch_ = progress.count("epoch") ? std::stoll(progress["epoch"]) : 0;
  global_step_ = progress.count("global_step") ? std::stoll(progress["global_step"]) : 0;
}

void FSDP2Strategy::remove_checkpoint(const std::string& path) {
  require(true, false, "remove_checkpoint");
  wait_for_checkpoint();
  const auto layout = checkpoint::DetectCheckpoint(path);
  if (layout == checkpoint::CheckpointLayout::kFull ||
      layout == checkpoint::CheckpointLayout::kFullFile) {
    checkpoint::RemoveFullCheckpoint(path, *world_);
  } else {
    checkpoint::RemoveCheckpoint(path, *world_);
  }
}

void FSDP2Strategy::check_checkpoint_target(const std::string& path) {
  require(true, false, "check_checkpoint_target");
  checkpoint::CheckCheckpointTarget(path, *world_);
}

std::string FSDP2Strategy::optimizer_state_dict() const {
  require_optimizer("optimizer_state_dict");
  wait_for_host_optimizer();
  torch::serialize::OutputArchive archive;
  optimizer_->save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void FSDP2Strategy::load_optimizer_state_dict(std::string state) {
  if (state.empty()) {
    throw InvalidArgumentError("load_optimizer_state_dict: empty state");
  }
  pending_optimizer_state_ = std::move(state);
}

std::vector<std::pair<std::string, at::Tensor>>
FSDP2Strategy::lightning_module_state_dict(bool rank0_only) {
  require(true, true, "lightning_module_state_dict");
  wait_for_host_optimizer();
  auto state = fsdp::full_state_dict(*module_->module());
  tp::gather_tensor_parallel(*module_->module(), state);
  if (rank0_only && world_->rank() != 0) state.clear();
  return state;
}

void FSDP2Strategy::load_model_state_dict(
    const std::vector<std::pair<std::string, at::Tensor>>& state, bool strict) {
  require(true, true, "load_model_state_dict");
  wait_for_host_optimizer();
  fsdp::load_full_state_dict(*module_->module(),
                             tp::local_state_dict(*module_->module(), state), strict);
}

}  // namespace strategy
}  // namespace fsdp2
