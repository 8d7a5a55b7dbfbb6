// fsdp2/core/checkpoint/sharded_checkpoint.h
//
// Sharded checkpoints: a directory in which every rank writes its own rows
// of every parameter and of its optimizer state, in parallel:
//
//   DIR/metadata.json              format, world size, global shapes and
//                                  dtypes, which rows each file holds,
//                                  optimizer kind and hyper-parameters,
//                                  user progress (epoch, step)
//   DIR/rank<r>-of-<N>.safetensors "model/<name>" and "optim/<key>/<name>":
//                                  this rank's rows; "row_start/<name>" and
//                                  "step/<name>" in its metadata
//
// Replicas (NO_SHARD, HYBRID_SHARD's other groups) do not write duplicates.
// Loading works on any number of ranks: each rank reads only the byte ranges
// of the rows it holds under its own sharding; every tensor's CRC-32 is
// checked once, the files spread over the loading ranks. Keys are parameter names, so
// a checkpoint that does not match the model fails loudly, naming the
// parameter. Saving is atomic: everything is written to DIR.tmp, which
// replaces DIR only once complete; a process killed at any point leaves the
// previous checkpoint loadable (if it died between the two renames of the
// swap, the next save or load moves DIR.old back).
//
// All functions are collective over the world.
#ifndef FSDP2_CORE_CHECKPOINT_SHARDED_CHECKPOINT_H_
#define FSDP2_CORE_CHECKPOINT_SHARDED_CHECKPOINT_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <map>
#include <string>

#include "core/checkpoint/background_saver.h"
#include "core/comm/world.h"

namespace fsdp2 {
namespace checkpoint {

// Saves the sharded model under `root` and `optimizer`'s state (AdamW, Adam
// or SGD; nullptr: model only) to `dir`, with `progress` (e.g. epoch and
// step) in metadata.json.
void SaveShardedCheckpoint(const std::string& dir, torch::nn::Module& root,
                           torch::optim::Optimizer* optimizer,
                           comm::World& world,
                           const std::map<std::string, std::string>& progress);

// The same in two parts, for background saves (background_saver.h): the
// collective part runs now and stages this rank's tensors (copies); the
// returned PendingWrite writes this rank's file and, on rank 0, waits up to
// `wait_for_ranks` for the others' files, writes metadata.json and swaps the
// directory in. Every rank must run its PendingWrite.
PendingWrite StageShardedCheckpoint(
    const std::string& dir, torch::nn::Module& root, torch::optim::Optimizer* optimizer,
    comm::World& world, const std::map<std::string, std::string>& progress,
    std::chrono::milliseconds wait_for_ranks = std::chrono::minutes(30));

// Loads `dir` into the live sharded model and optimizer (which must be of
// the saved kind) on any number of ranks. Returns the saved progress. Throws
// std::runtime_error naming the file or parameter on any mismatch or
// corruption; the model is then unchanged.
std::map<std::string, std::string> LoadShardedCheckpoint(
    const std::string& dir, torch::nn::Module& root,
    torch::optim::Optimizer* optimizer, comm::World& world);

// Deletes a checkpoint directory written by SaveShardedCheckpoint: rank 0,
// after a barrier, removes the files it knows and then the directory if it
// is empty. Refuses (std::runtime_error) a path that is not such a
// checkpoint.
void RemoveCheckpoint(const std::string& dir, comm::World& world);

}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_SHARDED_CHECKPOINT_H_
