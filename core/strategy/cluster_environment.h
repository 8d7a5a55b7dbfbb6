// fsdp2/core/strategy/cluster_environment.h
//
// ClusterEnvironment: who this process is in the job, read from the variables
// that launchers set, so one binary runs under torchrun, srun or mpirun:
//
//   torchrun / torchelastic / fsdp2's launcher: RANK, WORLD_SIZE, LOCAL_RANK,
//       GROUP_RANK, MASTER_ADDR, MASTER_PORT
//   SLURM (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//       SLURM_JOB_NODELIST (first host is the master), SLURM_JOB_ID
//   Open MPI (mpirun): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//       OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
//   none of those: a single local process.
//
// MASTER_ADDR and MASTER_PORT, when set, win over what is derived.
// FSDP2_STORE_PATH, when set, makes ranks meet through a FileStore at that
// shared path instead of TCP (no port needed; used by the test harness).
#ifndef FSDP2_CORE_STRATEGY_CLUSTER_ENVIRONMENT_H_
#define FSDP2_CORE_STRATEGY_CLUSTER_ENVIRONMENT_H_

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/comm/world.h"

namespace fsdp2 {
namespace strategy {

// Which launcher's variables Detect() read: none (kLocal, one process),
// torchrun's (kTorchElastic, also fsdp2's launcher), SLURM's or Open MPI's.
enum class ClusterKind { kLocal, kTorchElastic, kSlurm, kOpenMPI };
// "local", "torchelastic", "slurm" or "openmpi" (static storage).
const char* ToString(ClusterKind kind);

// Who this process is in the job, as Detect() reads it from the launcher's
// variables (the file comment lists them); each field's default is the
// single-process value.
struct ClusterEnvironment {
  ClusterKind kind = ClusterKind::kLocal;  // which launcher; default kLocal
  int rank = 0;  // this process's global rank, 0 <= rank < world_size
  int world_size = 1;  // processes in the job, >= 1
  int local_rank = 0;  // the rank on this node (picks the GPU); default 0
  int node_rank = 0;  // this node's number (GROUP_RANK, SLURM_NODEID, ...)
  // Rank 0's host for the TCP store: MASTER_ADDR, SLURM's first node, or
  // the default 127.0.0.1.
  std::string master_addr = "127.0.0.1";
  // The store's port: MASTER_PORT, 15000 + job id % 5000 under SLURM, or
  // the default 29500.
  int master_port = 29500;
  std::string store_path;  // FSDP2_STORE_PATH

  // How Detect() reads a variable: its value, or nullptr when unset.
  using Getenv = std::function<const char*(const char*)>;
  // Reads the environment (`getenv` is replaceable for tests). Throws
  // std::invalid_argument naming the variable when a value is malformed,
  // out of range, or the master address cannot be known.
  static ClusterEnvironment Detect(const Getenv& getenv = ::getenv);

  // The options comm::World's rendezvous takes: these rank, size, master
  // and store path, with `timeout` and `backend`.
  comm::RendezvousOptions ToRendezvous(std::chrono::milliseconds timeout,
                                       comm::Backend backend) const;
  // For logs, e.g. "slurm(rank=3, world_size=8, local_rank=3, node_rank=0,
  // master=node1:15042)".
  std::string ToString() const;
};

// HYBRID_SHARD's shard group when none is given: the ranks of one host.
// hosts[r] is rank r's host (comm::World::hosts(), "name/boot-id"). Every
// host must hold the same number of ranks, with consecutive rank numbers (as
// torchrun, srun's block distribution and mpirun's default by-slot mapping
// give); otherwise throws std::invalid_argument naming the hosts and saying
// to set shard_group_size.
int RanksPerHost(const std::vector<std::string>& hosts);

// The first host of a SLURM node list: "gpu[03-05,9],cpu1" -> "gpu03".
std::string FirstSlurmHost(const std::string& nodelist);

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_CLUSTER_ENVIRONMENT_H_
