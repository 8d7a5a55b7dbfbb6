#include "core/launch/allocator.h"
#include "core/common/error.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <vector>

namespace fsdp2 {
namespace launch {
namespace {

constexpr char kAllocatorVar[] = "FSDP2_ALLOCATOR";

// The library names that provide each allocator, preferred first.
std::vector<std::string> LibraryNames(const std::string& allocator) {
  if (allocator == "tcmalloc") {
    return {"libtcmalloc_minimal.so.4", "libtcmalloc.so.4"};
  }
  if (allocator == "jemalloc") return {"libjemalloc.so.2"};
  return {};
}

// Every shared object loaded into this process, by path.
std::vector<std::string> LoadedObjects() {
  std::vector<std::string> paths;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
          static_cast<std::vector<std::string>*>(data)->push_back(info->dlpi_name);
        }
        return 0;
      },
      &paths);
  return paths;
}

// Where this system keeps its shared libraries: the folder of the libc this
// process runs with (e.g. /lib/x86_64-linux-gnu), then the usual others.
std::vector<std::filesystem::path> LibraryDirs() {
  std::vector<std::filesystem::path> dirs;
  for (const auto& path : LoadedObjects()) {
    if (std::filesystem::path(path).filename() == "libc.so.6") {
      const auto dir = std::filesystem::path(path).parent_path();
      dirs.push_back(dir);
      dirs.push_back(std::filesystem::path("/usr/lib") / dir.filename());
    }
  }
  for (const char* dir : {"/usr/local/lib", "/usr/lib64", "/usr/lib", "/lib64"}) {
    dirs.emplace_back(dir);
  }
  return dirs;
}

bool UnderAddressSanitizer() {
  return dlsym(RTLD_DEFAULT, "__asan_init") != nullptr;
}

bool Contains(const std::string& list, const std::string& item) {
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find_first_of(": ", start);
    if (end == std::string::npos) end = list.size();
    if (list.compare(start, end - start, item) == 0) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

std::string RequestedAllocator() {
  const char* value = std::getenv(kAllocatorVar);
  if (value == nullptr || *value == '\0') return "tcmalloc";
  const std::string v = value;
  if (v == "tcmalloc" || v == "jemalloc" || v == "system") return v;
  throw InvalidArgumentError(std::string(kAllocatorVar) + "='" + v +
                              "' is not an allocator fsdp2 knows (expected "
                              "tcmalloc, jemalloc or system)");
}

std::string AllocatorLibrary(const std::string& allocator) {
  for (const auto& name : LibraryNames(allocator)) {
    for (const auto& dir : LibraryDirs()) {
      std::error_code error;
      const auto path = dir / name;
      if (std::filesystem::is_regular_file(path, error)) return path.string();
    }
  }
  return "";
}

std::string ActiveAllocator() {
  for (const auto& path : LoadedObjects()) {
    const std::string file = std::filesystem::path(path).filename().string();
    for (const char* allocator : {"tcmalloc", "jemalloc"}) {
      for (const auto& name : LibraryNames(allocator)) {
        if (file == name) return allocator;
      }
    }
  }
  return "system";
}

std::string RankPreload(const std::string& current) {
  const std::string allocator = RequestedAllocator();
  if (allocator == "system" || UnderAddressSanitizer()) return current;
  const std::string library = AllocatorLibrary(allocator);
  if (library.empty()) {
    static bool warned = false;
    if (!warned) {
      warned = true;
      std::cerr << "fsdp2: " << allocator << " is not installed (run "
                << "scripts/setup.sh, or apt-get install "
                << (allocator == "tcmalloc" ? "libtcmalloc-minimal4" : "libjemalloc2")
                << "); training with the system allocator, which is up to 2x "
                   "slower. Set "
                << kAllocatorVar << "=system to silence this.\n";
    }
    return current;
  }
  if (Contains(current, library)) return current;
  return current.empty() ? library : library + ":" + current;
}

}  // namespace launch
}  // namespace fsdp2
