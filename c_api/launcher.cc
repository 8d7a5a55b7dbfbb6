// fsdp2/c_api/launcher.cc
//
// Launching ranks: fsdp2_is_rank_process and fsdp2_launch_local over
// core/launch and the cluster environment.
#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
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
  FSDP2_API_BEGIN
  NotNull(exit_code, "exit_code");
  Require(argc >= 1 && argv != nullptr, "argv must hold at least the program name");
  Require(threads_per_rank >= 0, "threads_per_rank must be 0 (auto) or positive");
  fsdp2::launch::LocalLaunchOptions options;
  options.nproc = nproc;
  options.threads_per_rank = threads_per_rank;
  for (int i = 0; i < argc; ++i) options.argv.push_back(NotNull(argv[i], "argv[i]"));
  *exit_code = fsdp2::launch::LaunchLocal(options);
  FSDP2_API_END
}

}  // extern "C"
