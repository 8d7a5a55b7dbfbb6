#include "core/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>

#include "core/checkpoint/internal/shared_error.h"
#include "core/checkpoint/internal/swap.h"
#include "core/common/error.h"

namespace fsdp2 {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;

// The nearest directory at or above `path` that exists; throws when a
// component on the way is not a directory.
fs::path ExistingAncestor(const fs::path& path, const std::string& target) {
  fs::path p = fs::absolute(path);
  while (!p.empty() && !fs::exists(p)) {
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  if (!fs::is_directory(p)) {
    throw IoError(target + ": cannot be created: " + p.string() + " is a file, not a directory");
  }
  return p;
}

void FsyncDirectory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

namespace internal {

bool IsCheckpointFile(const std::string& name) {
  static const std::regex shard("rank[0-9]+-of-[0-9]+\\.safetensors");
  return name == "metadata.json" || name == kFullCheckpointFile ||
         std::regex_match(name, shard);
}

void RecoverInterruptedSwap(const std::string& dir) {
  const std::string old = dir + ".old";
  if (!fs::exists(dir) && fs::is_directory(old)) fs::rename(old, dir);
}

std::string BeginSave(const std::string& dir) {
  RecoverInterruptedSwap(dir);
  CheckCheckpointTarget(dir);
  const std::string tmp = dir + ".tmp";
  fs::remove_all(tmp);  // a save that died before
  fs::create_directories(tmp);
  return tmp;
}

void CommitSave(const std::string& dir) {
  const std::string tmp = dir + ".tmp", old = dir + ".old";
  FsyncDirectory(tmp);
  fs::remove_all(old);
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(tmp, dir);
  FsyncDirectory(fs::absolute(dir).parent_path());
  fs::remove_all(old);
}

}  // namespace internal

CheckpointLayout DetectCheckpoint(const std::string& path) {
  std::string p = path;
  if (!fs::exists(p) && fs::is_directory(p + ".old")) p += ".old";
  if (!fs::exists(p)) return CheckpointLayout::kNone;
  if (!fs::is_directory(p)) return CheckpointLayout::kFullFile;
  if (fs::exists(fs::path(p) / kFullCheckpointFile)) return CheckpointLayout::kFull;
  return CheckpointLayout::kSharded;
}

std::string NewestCheckpoint(const std::string& dir) {
  auto complete = [](const std::string& p) {
    for (const std::string& d : {p, p + ".old"}) {
      if (fs::is_regular_file(fs::path(d) / kFullCheckpointFile) ||
          fs::is_regular_file(fs::path(d) / "metadata.json")) {
        return true;
      }
    }
    return false;
  };
  if (complete(dir)) return dir;
  std::string newest;
  long long newest_step = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    static const std::regex step("step-([0-9]+)");
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, step) || !complete(e.path().string())) continue;
    const long long n = std::stoll(m[1]);
    if (n > newest_step) {
      newest_step = n;
      newest = e.path().string();
    }
  }
  return newest;
}

void CheckCheckpointTarget(const std::string& dir) {
  if (dir.empty()) throw IoError("checkpoint target: an empty path");
  const fs::path target = fs::absolute(dir);
  if (fs::exists(target)) {
    if (!fs::is_directory(target)) {
      throw IoError(dir + ": exists and is a file; checkpoints are directories in both "
                    "formats (a single-file checkpoint of an earlier fsdp2 still loads): "
                    "choose a new or empty directory");
    }
    for (const auto& e : fs::directory_iterator(target)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file() || !internal::IsCheckpointFile(name)) {
        throw IoError(dir + ": holds '" + name + "', which is not part of an fsdp2 "
                      "checkpoint; a save would replace the directory: choose a new or "
                      "empty directory");
      }
    }
  }
  // DIR.tmp is written beside DIR and renamed: DIR's parent (or what will
  // become it) must take a new directory.
  const fs::path parent = ExistingAncestor(target.parent_path(), dir);
  const fs::path probe = parent / (".fsdp2-probe-" + std::to_string(::getpid()));
  if (::mkdir(probe.c_str(), 0700) != 0) {
    throw IoError(dir + ": cannot be written: creating a directory in " + parent.string() +
                  " failed: " + std::strerror(errno));
  }
  ::rmdir(probe.c_str());
}

void CheckCheckpointTarget(const std::string& dir, comm::World& world) {
  std::string error;
  if (world.rank() == 0) {
    try {
      CheckCheckpointTarget(dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  internal::ShareRank0Error(error, world, dir + ": rank 0 cannot save a checkpoint there");
}

}  // namespace checkpoint
}  // namespace fsdp2
