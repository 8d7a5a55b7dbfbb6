// fsdp2/core/checkpoint/internal/shared_error.h
//
// A checkpoint step that can fail on some ranks must end the same way on
// every rank: each rank passes its own error message ("" on success) and,
// if any rank failed, every rank throws IoError, with its own message where
// it failed and a message naming the others' failure where it did not.
// Collective over the world's group: every rank calls the same functions
// in the same order.
#ifndef FSDP2_CORE_CHECKPOINT_INTERNAL_SHARED_ERROR_H_
#define FSDP2_CORE_CHECKPOINT_INTERNAL_SHARED_ERROR_H_

#include <optional>
#include <string>

#include "core/comm/world.h"

namespace fsdp2 {
namespace checkpoint {
namespace internal {

// Whether any rank's `error` is non-empty: the highest such rank, or
// nullopt when every rank succeeded.
std::optional<int> FailedRank(const std::string& error, comm::World& world);

// Throws IoError on every rank if any rank's `error` is non-empty: `error`
// where it is, else `other_ranks_error`.
void ThrowIfAnyRankFailed(const std::string& error, comm::World& world,
                          const std::string& other_ranks_error);

// For checks that only rank 0 performs (validating or removing a file):
// `error` is rank 0's message, other ranks pass "" and, on failure, throw
// `other_ranks_error`. Costs one broadcast from rank 0.
void ShareRank0Error(
    const std::string& error, comm::World& world,
    const std::string& other_ranks_error = "rank 0 rejected the checkpoint (see its error)");

}  // namespace internal
}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_INTERNAL_SHARED_ERROR_H_
