// fsdp2/c_api/launcher.cc
//
// Launching ranks: fsdp2_is_rank_process, fsdp2_launch_local,
// fsdp2_restart_with_rank_environment and fsdp2_allocator over core/launch
// and the cluster environment.
#include <string>
#include <vector>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "core/launch/allocator.h"
#include "core/launch/local_launcher.h"
#include "core/strategy/cluster_environment.h"

using fsdp2::c_api::NotNull;
using fsdp2::c_api::Require;

extern "C" {

fsdp2_status_t fsdp2_is_rank_process(int32_t* is_rank) {
  FSDP2_API_BEGIN
  NotNull(is_rank, "is_rank");
  *is_rank = fsdp2::strategy::ClusterEnvironment::Detect().kind !=
                     fsdp2::strategy::ClusterKind::kLocal
                 ? 1
                 : 0;
  FSDP2_API_END
}

fsdp2_status_t fsdp2_launch_local(int32_t nproc, int32_t threads_per_rank, int argc,
                                  char** argv, int32_t* exit_code) {
  return fsdp2_launch_local_with_restarts(nproc, threads_per_rank, 0, argc, argv, exit_code);
}

fsdp2_status_t fsdp2_launch_local_with_restarts(int32_t nproc, int32_t threads_per_rank,
                                                int32_t max_restarts, int argc, char** argv,
                                                int32_t* exit_code) {
  FSDP2_API_BEGIN
  NotNull(exit_code, "exit_code");
  Require(argc >= 1 && argv != nullptr, "argv must hold at least the program name");
  Require(threads_per_rank >= 0, "threads_per_rank must be 0 (auto) or positive");
  Require(max_restarts >= 0, "max_restarts must be 0 or positive");
  fsdp2::launch::LocalLaunchOptions options;
  options.nproc = nproc;
  options.threads_per_rank = threads_per_rank;
  options.max_restarts = max_restarts;
  for (int i = 0; i < argc; ++i) options.argv.push_back(NotNull(argv[i], "argv[i]"));
  *exit_code = fsdp2::launch::LaunchLocal(options);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_restart_count(int32_t* restart_count) {
  FSDP2_API_BEGIN
  NotNull(restart_count, "restart_count");
  *restart_count = fsdp2::launch::RestartCount();
  FSDP2_API_END
}

fsdp2_status_t fsdp2_restart_with_rank_environment(int argc, char** argv) {
  FSDP2_API_BEGIN
  Require(argc >= 1 && argv != nullptr, "argv must hold at least the program name");
  std::vector<char*> args;  // NULL-terminated for execv, whatever the caller passed
  for (int i = 0; i < argc; ++i) args.push_back(NotNull(argv[i], "argv[i]"));
  args.push_back(nullptr);
  fsdp2::launch::ReexecWithRankEnvironment(args.data());
  FSDP2_API_END
}

const char* fsdp2_allocator(void) {
  // Which library is loaded cannot change once the process runs.
  static const std::string allocator = fsdp2::launch::ActiveAllocator();
  return allocator.c_str();
}

}  // extern "C"
