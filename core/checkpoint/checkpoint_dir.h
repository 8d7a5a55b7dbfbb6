// fsdp2/core/checkpoint/checkpoint_dir.h
//
// Where a checkpoint lives. In both formats a checkpoint is a directory:
//
//   DIR/metadata.json, DIR/rank<r>-of-<N>.safetensors   sharded
//   DIR/checkpoint.safetensors                          full (one file)
//
// A save writes DIR.tmp and swaps it in (DIR -> DIR.old, DIR.tmp -> DIR),
// whatever the format, so a new save of either format replaces an earlier
// checkpoint of either format, and a crash at any point leaves the previous
// one loadable. Single-file full checkpoints of earlier fsdp2 versions (a
// plain .safetensors path) still load.
//
// A target is fit for a save when it does not exist (and its parent can be
// created and written), or is a directory that is empty or holds only
// checkpoint files. Anything else (a file, a directory with other files, a
// read-only place) is refused before any training, by CheckCheckpointTarget.
#ifndef FSDP2_CORE_CHECKPOINT_CHECKPOINT_DIR_H_
#define FSDP2_CORE_CHECKPOINT_CHECKPOINT_DIR_H_

#include <string>

#include "core/comm/world.h"

namespace fsdp2 {
namespace checkpoint {

// The file a full checkpoint DIR holds.
constexpr const char* kFullCheckpointFile = "checkpoint.safetensors";

// What DetectCheckpoint finds at a path, i.e. which loader reads it.
enum class CheckpointLayout {
  kNone,      // nothing there
  kSharded,   // a directory (holding metadata.json, or not yet valid)
  kFull,      // DIR/checkpoint.safetensors
  kFullFile,  // a single safetensors file (earlier fsdp2 versions)
};

// What `path` holds. A checkpoint that a crash left as DIR.old between the
// two renames of a swap counts as DIR (the loaders put it back). Reads only.
CheckpointLayout DetectCheckpoint(const std::string& path);

// The newest complete checkpoint at `dir`: `dir` itself when it holds one
// (a sharded checkpoint's metadata.json, a full one's file, or either left
// as DIR.old by a crash mid-swap), else its step-<N> subdirectory with the
// largest N that holds one (the main job's --ckpt-keep layout); "" if none.
// A save that died leaves only DIR.tmp, which never counts.
std::string NewestCheckpoint(const std::string& dir);

// Throws IoError (std::runtime_error) saying what is wrong and what to do
// unless a checkpoint can be saved to `dir`: see above. Probes writability
// by creating and removing a directory beside `dir`; creates nothing else.
void CheckCheckpointTarget(const std::string& dir);
// The same, collective over the world: rank 0 checks, every rank throws.
void CheckCheckpointTarget(const std::string& dir, comm::World& world);

}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_CHECKPOINT_DIR_H_
