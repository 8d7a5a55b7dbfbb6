// fsdp2/core/checkpoint/hf_checkpoint.h
//
// Hugging Face checkpoints: the weights transformers' save_pretrained writes
// and from_pretrained reads. A directory holds either one model.safetensors
// or shards model-00001-of-0000N.safetensors with model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor name: file name}}); every file
// is a safetensors file whose tensors carry the parameters' names.
//
// Loading reads, on each rank, only the rows of each parameter that rank
// holds (FSDP's rows of a parameter, the whole tensor for a tensor-parallel
// block), straight into the parameter where the dtype matches, converted
// (bf16, fp16, fp32, fp64) where it does not: no rank ever holds the model.
// Saving gathers one parameter at a time and rank 0 streams it into the
// shard it belongs to, so rank 0 holds at most one full parameter.
// Issue #27; docs/design/hf-llama-plan.md.
#ifndef FSDP2_CORE_CHECKPOINT_HF_CHECKPOINT_H_
#define FSDP2_CORE_CHECKPOINT_HF_CHECKPOINT_H_

#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/comm/world.h"

namespace fsdp2 {
namespace checkpoint {

// The weight files of a Hugging Face checkpoint.
struct HfWeights {
  std::string dir;  // the checkpoint's directory (an index's or file's parent)
  std::map<std::string, std::string> file_of;  // tensor name -> file path
};

// Whether `path` looks like a Hugging Face checkpoint: a directory with
// model.safetensors or model.safetensors.index.json, or such an index file.
bool IsHfCheckpoint(const std::string& path);

// Where each tensor of the checkpoint at `path` lives (a directory as above,
// an index file, or one .safetensors file). Throws NotFoundError when there
// is none (naming pytorch_model.bin, which is not read, where present), and
// IoError for an index that is not one.
HfWeights ResolveHfWeights(const std::string& path);

// Loads the checkpoint at `path` into `root`'s parameters (sharded or not,
// any dtype). Collective over `world`. Every rank first checks the headers:
// a parameter the checkpoint lacks, a tensor the model lacks, a shape that
// differs, an index naming a file or a tensor that is not there, a dtype
// other than F64/F32/F16/BF16 -- each an IoError naming the tensor (and the
// file), thrown on every rank before any parameter is written. A read that
// fails later leaves the parameters partly loaded and says so on every
// rank. Buffers are not read.
// `keep` names parameters the checkpoint does not hold by design (LoRA
// adapters over a base checkpoint): they keep their values.
void LoadHfWeights(const std::string& path, torch::nn::Module& root, comm::World& world,
                   const std::function<bool(const std::string& name)>& keep = nullptr);

// Gathers the full tensor of the parameter named `name` (collective: every
// rank calls it for the same names in the same order).
using GatherParameter = std::function<at::Tensor(const std::string& name)>;

// How SaveHfWeights writes the weight files: shard size and dtype, and for
// PEFT adapters and merged saves which tensors go in under which names.
struct HfSaveOptions {
  // A shard is closed before a tensor that would take it past this many
  // bytes (a larger tensor gets a shard of its own); transformers' rule.
  int64_t max_shard_bytes = 5'000'000'000;
  // The files' dtype (default: each parameter's own).
  c10::optional<at::ScalarType> dtype;
  // The weight files' stem: "model" (model.safetensors or model-0000i-of-
  // 0000N.safetensors with model.safetensors.index.json) or
  // "adapter_model" (PEFT's adapter_model.safetensors, never sharded).
  std::string weights_name = "model";
  // The name each parameter is saved under, "" to leave it out; default:
  // every parameter under its own name. The same on every rank.
  std::function<std::string(const std::string& name)> rename;
  // What is written for parameter `name` given its gathered full tensor
  // (default: that tensor); may gather others. Runs on every rank.
  std::function<at::Tensor(const std::string& name, const at::Tensor& full,
                           const GatherParameter& gather)>
      transform;
  // More files for the directory, name -> text (generation_config.json,
  // adapter_config.json), written with config.json.
  std::map<std::string, std::string> files;
  // Files copied into the directory (a tokenizer's); a path that does not
  // exist is skipped.
  std::vector<std::string> copy_files;
};

// The tokenizer's and generation's files of a Hugging Face checkpoint
// directory that a save copies along (those present of tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, tokenizer.model,
// vocab.json, merges.txt, added_tokens.json, chat_template.jinja,
// chat_template.json, generation_config.json), as paths.
std::vector<std::string> HfCompanionFiles(const std::string& dir);

// "5GB", "500MB", "40KB" (powers of 10), "2GiB", "10MiB", "1KiB" (powers
// of 2) or a number of bytes; InvalidArgumentError otherwise.
int64_t ParseShardSize(const std::string& text);

// Saves `root`'s parameters into directory `dir` in transformers' layout:
// model.safetensors, or model-0000i-of-0000N.safetensors and
// model.safetensors.index.json when they need several shards, each file
// with {"format": "pt"} metadata, and `config_json` as config.json (none
// when it is empty), with options.files and options.copy_files. The
// directory is replaced atomically (an interrupted save leaves the previous
// one); a directory holding other files is refused. Collective over `world`.
void SaveHfWeights(const std::string& dir, torch::nn::Module& root,
                   const std::string& config_json, const HfSaveOptions& options,
                   comm::World& world);

}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_HF_CHECKPOINT_H_
