// fsdp2/core/launch/allocator.h
//
// The memory allocator every training process runs with.
//
// glibc's malloc hands blocks above its mmap threshold back to the kernel
// when they are freed, so each step faults in its activations and unit
// buffers afresh: measured here, a quarter of all cycles of the main job
// went to page faults and a step took twice as long as with tcmalloc (see
// docs/main-job.md, "The runtime environment"). fsdp2 therefore runs its ranks with tcmalloc
// (Debian's libtcmalloc-minimal4, installed by scripts/setup.sh), put in
// place with LD_PRELOAD: the local launcher adds it to every rank it starts
// (C++, C, Python and Java ranks alike), and the main job, when an outside
// launcher (torchrun, srun, mpirun) started it without it, re-executes
// itself once with it (local_launcher.h, ReexecWithRankEnvironment).
//
// FSDP2_ALLOCATOR chooses: "tcmalloc" (the default), "jemalloc", or
// "system" (glibc's malloc, nothing preloaded). An allocator that is not
// installed falls back to the system one with a warning on stderr. Nothing
// is preloaded into a process that runs under AddressSanitizer, which must
// own malloc itself.
#ifndef FSDP2_CORE_LAUNCH_ALLOCATOR_H_
#define FSDP2_CORE_LAUNCH_ALLOCATOR_H_

#include <map>
#include <string>

namespace fsdp2 {
namespace launch {

// The allocator FSDP2_ALLOCATOR asks for: "tcmalloc", "jemalloc" or
// "system". Throws std::invalid_argument naming the variable on any other
// value.
std::string RequestedAllocator();

// The shared library that provides `allocator` ("tcmalloc" or "jemalloc")
// on this machine, or "" if it is not installed (or for "system").
std::string AllocatorLibrary(const std::string& allocator);

// The allocator this process runs with: "tcmalloc" or "jemalloc" when that
// library is loaded into it, otherwise "system".
std::string ActiveAllocator();

// The LD_PRELOAD value a rank should start with so that it runs with the
// requested allocator: `current` (the caller's LD_PRELOAD, possibly empty)
// with the allocator's library put first, or `current` unchanged for
// "system", when the library is missing (after a warning on stderr), or
// under AddressSanitizer.
std::string RankPreload(const std::string& current);

}  // namespace launch
}  // namespace fsdp2

#endif  // FSDP2_CORE_LAUNCH_ALLOCATOR_H_
