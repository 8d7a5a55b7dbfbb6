// fsdp2/core/checkpoint/full_checkpoint.h
//
// Full checkpoints: a directory (see checkpoint_dir.h) holding one
// safetensors file, checkpoint.safetensors, written by rank 0, holding every
// parameter unsharded under its own name (a plain model state dict that any
// safetensors reader loads) and the optimizer state as "optim/<key>/<name>",
// with the optimizer kind, per-parameter steps and progress in metadata.
// Tensors are gathered and streamed one at a time, so rank 0 never holds
// more than one full tensor beyond its shards. The directory is swapped in
// atomically, as a sharded one is.
// Loading works on any number of ranks; rank 0 verifies every checksum
// first, then each rank reads only its rows.
//
// All functions are collective over the world.
#ifndef FSDP2_CORE_CHECKPOINT_FULL_CHECKPOINT_H_
#define FSDP2_CORE_CHECKPOINT_FULL_CHECKPOINT_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <string>

#include "core/checkpoint/background_saver.h"
#include "core/comm/world.h"

namespace fsdp2 {
namespace checkpoint {

// Writes `root`'s parameters, `optimizer`'s state (nullptr: the model only)
// and `progress` (string counters such as epoch and step, kept in the
// metadata) to DIR/checkpoint.safetensors, swapped in atomically; returns
// after a final barrier, so the checkpoint is in place on every rank.
void SaveFullCheckpoint(const std::string& dir, torch::nn::Module& root,
                        torch::optim::Optimizer* optimizer, comm::World& world,
                        const std::map<std::string, std::string>& progress);

// The same in two parts, for background saves (background_saver.h): the
// gathers run now and rank 0 keeps every full tensor (the whole model and
// optimizer state in its memory); the returned PendingWrite (a no-op on other
// ranks) writes the file and swaps the directory in.
PendingWrite StageFullCheckpoint(const std::string& dir, torch::nn::Module& root,
                                 torch::optim::Optimizer* optimizer, comm::World& world,
                                 const std::map<std::string, std::string>& progress);

// Loads DIR (or a single-file checkpoint of an earlier fsdp2). Throws
// std::runtime_error naming the file or parameter on any mismatch or
// corruption; the model is then unchanged.
std::map<std::string, std::string> LoadFullCheckpoint(
    const std::string& path, torch::nn::Module& root,
    torch::optim::Optimizer* optimizer, comm::World& world);

// Rank 0 deletes the checkpoint at `path` (DIR or an earlier single file)
// after a barrier; refuses (std::runtime_error) anything else.
void RemoveFullCheckpoint(const std::string& path, comm::World& world);

}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_FULL_CHECKPOINT_H_
