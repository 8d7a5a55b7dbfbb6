// fsdp2/core/launch/local_launcher.h
//
// Runs a program as N ranks on this machine, like torchrun's --nproc or
// Lightning's subprocess launcher: the current executable is started N times
// with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a free
// MASTER_PORT, their output is forwarded line by line with a "[rank r]"
// prefix, and if one rank fails the others are stopped.
//
// It also sets what LibTorch needs to run well on CPU unless the caller's
// environment already says otherwise: OMP_NUM_THREADS (threads per rank),
// OMP_WAIT_POLICY=PASSIVE, and the allocator (tcmalloc through LD_PRELOAD;
// see allocator.h).
#ifndef FSDP2_CORE_LAUNCH_LOCAL_LAUNCHER_H_
#define FSDP2_CORE_LAUNCH_LOCAL_LAUNCHER_H_

#include <map>
#include <string>
#include <vector>

namespace fsdp2 {
namespace launch {

struct LocalLaunchOptions {
  int nproc = 2;
  // argv of each rank (argv[0] is ignored: the current executable runs).
  std::vector<std::string> argv;
  int threads_per_rank = 0;  // 0: cores / nproc, at least 1
  std::map<std::string, std::string> env;  // extra variables for every rank
  // When a rank fails, all ranks are stopped and, up to this many times,
  // started again (FSDP2_RESTART_COUNT tells them which run they are: 0
  // first). A program resumes from its newest complete checkpoint on a
  // restart (see checkpoint::NewestCheckpoint); the main job does.
  int max_restarts = 0;
};

// The variable LaunchLocal sets to the restart count, and its value in this
// process (0 when unset).
constexpr const char* kRestartCountEnv = "FSDP2_RESTART_COUNT";
int RestartCount();

// Launches the ranks and waits for them. Returns 0 if every rank exited 0;
// otherwise (after max_restarts restarts) the first failing rank's exit
// code (128 + signal if killed), after printing "fsdp2 launcher: rank R
// failed (...)" to stderr. Throws std::invalid_argument if nproc < 1 or
// max_restarts < 0.
int LaunchLocal(const LocalLaunchOptions& options);

// True in a process started by LaunchLocal (or any launcher that set RANK).
bool IsRankProcess();

// The CPU's feature flags as /proc/cpuinfo lists them, with a space before
// and after each (" avx2 avx512f ... "), so " name " can be searched for;
// " " when unknown.
std::string CpuFlags();

// Whether the space-separated flag list `flags` (CpuFlags()'s, padded or
// not) names `flag` as a whole word: "avx512f" is not found in "avx512fp16".
bool HasCpuFlag(const std::string& flags, const std::string& flag);

// The CPU's vendor as /proc/cpuinfo names it ("GenuineIntel",
// "AuthenticAMD", ...); "" when unknown.
std::string CpuVendor();

// The environment LibTorch wants for fast CPU training here:
// OMP_WAIT_POLICY=PASSIVE (OpenMP threads sleep instead of spinning between
// parallel regions), left out when the caller already set it, and
// LD_PRELOAD with the allocator of allocator.h put in front of the caller's
// own LD_PRELOAD (left out when nothing is to be added, or when this
// process already runs with that allocator: then so do the programs it
// starts, unless it got the allocator some other way than LD_PRELOAD). A
// launcher assigns every variable returned.
std::map<std::string, std::string> CpuPerformanceEnv();

// For the entry point of a program that trains, started as one rank by an
// outside launcher (torchrun, srun, mpirun): these variables are read when
// the libraries load, before main, so if CpuPerformanceEnv() has anything
// to add, re-executes the program (its own binary, with the same argv, so
// that ps and pgrep still show its name) with it, once, and does not return.
// Otherwise returns. FSDP2_RANK_ENV_EXEC marks the second run, so a library
// that cannot be preloaded never loops. `argv`: the NULL-terminated command
// line, as main gets it.
void ReexecWithRankEnvironment(char** argv);

// A TCP port on 127.0.0.1 that was free a moment ago.
int FindFreePort();

// This process's environment as a map.
std::map<std::string, std::string> CurrentEnvironment();

// Starts the current executable (/proc/self/exe) with `argv` (argv[0] as
// given) and exactly the variables in `env`, its stdout and stderr written
// to `output_fd` (the caller keeps and closes its own copy). Returns the
// child's pid. Throws std::runtime_error if it cannot fork.
int SpawnSelf(const std::vector<std::string>& argv,
              const std::map<std::string, std::string>& env, int output_fd);

}  // namespace launch
}  // namespace fsdp2

#endif  // FSDP2_CORE_LAUNCH_LOCAL_LAUNCHER_H_
