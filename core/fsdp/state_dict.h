// fsdp2/core/fsdp/state_dict.h
//
// Full state dicts of a sharded model, and where each parameter's rows live
// (for the checkpoint formats in core/checkpoint): the full value of every
// parameter, gathered over its shard group, under the name
// root.named_parameters() gives it, and the way back into the shards.
// Tensor parallelism builds its state dicts on these (core/tp/state_dict.h).
// fully_shard.h includes this header.
//
// Thread-safety: as fully_shard.h (one training thread per process).
#ifndef FSDP2_CORE_FSDP_STATE_DICT_H_
#define FSDP2_CORE_FSDP_STATE_DICT_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/process_group.h"

namespace fsdp2 {
namespace fsdp {

// The full (unsharded) value of every parameter under `root`, named as
// root.named_parameters() names them, in the parameters' own dtype (the
// masters under mixed precision), as new tensors. Collective: every rank of
// every shard group under `root` calls it.
std::vector<std::pair<std::string, at::Tensor>> full_state_dict(
    torch::nn::Module& root);

// Copies full values into the sharded parameters under `root`: each rank
// keeps its own rows. Names as in full_state_dict(). Throws
// std::invalid_argument naming the parameter on a missing or unexpected name
// (when `strict`) or a shape mismatch; nothing is modified then.
void load_full_state_dict(
    torch::nn::Module& root,
    const std::vector<std::pair<std::string, at::Tensor>>& state,
    bool strict = true);

// Where each parameter under `root` lives on this rank, for checkpoints.
struct ShardInfo {
  std::string name;            // as root.named_parameters() names it
  at::Tensor shard;            // the optimizer's parameter (local rows)
  std::vector<int64_t> global_shape;  // the unsharded parameter's shape
  int64_t rows = 0;            // global dim-0 size (1 for 0-d parameters)
  int64_t row_start = 0;       // first global row held here
  int64_t local_rows = 0;      // rows held here (0 on ranks past the end)
  // True on exactly one rank per distinct row range: replicas (NO_SHARD,
  // HYBRID_SHARD's other groups, parameters outside FSDP) are not primary.
  bool primary = true;
  // The ranks that hold the other rows (null: this rank holds them all), and
  // the padded rows per rank that an all-gather over that group exchanges.
  std::shared_ptr<comm::ProcessGroup> group;
  int64_t shard_rows = 0;      // padded rows per rank (rows for a replica)
};

// The full value of a tensor shaped like `info.shard` (the shard itself, or
// optimizer state that shards the same way), gathered over info.group.
// Collective over that group.
at::Tensor gather_rows(const ShardInfo& info, const at::Tensor& local);
// One ShardInfo per parameter under `root`, in named_parameters() order.
// `world_rank` decides `primary` for parameters outside FSDP (rank 0's
// copy is primary). Local: no communication.
std::vector<ShardInfo> shard_info(torch::nn::Module& root, int world_rank);

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_STATE_DICT_H_
