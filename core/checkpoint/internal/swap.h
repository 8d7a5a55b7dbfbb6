// fsdp2/core/checkpoint/internal/swap.h
//
// The atomic directory swap both checkpoint formats save through (see
// checkpoint_dir.h). Rank 0 only; callers share errors with
// ShareRank0Error (shared_error.h).
#ifndef FSDP2_CORE_CHECKPOINT_INTERNAL_SWAP_H_
#define FSDP2_CORE_CHECKPOINT_INTERNAL_SWAP_H_

#include <string>

namespace fsdp2 {
namespace checkpoint {
namespace internal {

// A crash between the two renames of a swap leaves the previous checkpoint
// as DIR.old only: put it back.
void RecoverInterruptedSwap(const std::string& dir);

// Checks the target (CheckCheckpointTarget) and returns a fresh, empty
// DIR.tmp to write into.
std::string BeginSave(const std::string& dir);

// Replaces DIR by the complete DIR.tmp (fsync'ed renames).
void CommitSave(const std::string& dir);

// Whether a file of this name belongs to a checkpoint directory.
bool IsCheckpointFile(const std::string& name);

}  // namespace internal
}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_INTERNAL_SWAP_H_
