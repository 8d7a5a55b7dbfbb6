// fsdp2/core/checkpoint/internal/rank0_error.h
//
// Checks that only rank 0 performs (validating or removing a file) must end
// the same way on every rank: ShareRank0Error broadcasts whether rank 0
// failed and throws on all ranks if it did.
#ifndef FSDP2_CORE_CHECKPOINT_INTERNAL_RANK0_ERROR_H_
#define FSDP2_CORE_CHECKPOINT_INTERNAL_RANK0_ERROR_H_

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "core/comm/world.h"
#include "core/common/error.h"

namespace fsdp2 {
namespace checkpoint {
namespace internal {

// `error` is rank 0's message (empty: success); other ranks pass "" and,
// on failure, throw `other_ranks_error`.
inline void ShareRank0Error(
    const std::string& error, comm::World& world,
    const std::string& other_ranks_error = "rank 0 rejected the checkpoint (see its error)") {
  at::Tensor failed = at::full({1}, error.empty() ? 0.0 : 1.0, at::kDouble);
  world.group()->broadcast(failed, 0).wait();
  if (failed.item<double>() != 0) {
    throw IoError(world.rank() == 0 ? error : other_ranks_error);
  }
}

}  // namespace internal
}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_INTERNAL_RANK0_ERROR_H_
