// fsdp2/core/comm/world.h
//
// World: this process's place among all ranks of a job, created by a
// rendezvous, and the factory for process groups over subsets of ranks.
//
// Rendezvous goes through a key-value store: a TCPStore served by rank 0 at
// MASTER_ADDR:MASTER_PORT, or a FileStore at a shared path; a world of one
// rank without a FileStore path uses an in-process store and no port. A
// process may create several Worlds, one after another or alive at once (a
// notebook, a sweep), as long as every rank creates them in the same order:
// the n-th World of each rank meets the others' n-th. Each keeps its keys
// under a prefix of its own, rank 0 serves MASTER_PORT once for all of them
// (until the process ends), and over a FileStore the n-th World (n >= 1)
// uses the file "<path>.world<n>". Every rank checks
// that all ranks agree on the world size; a rank that never arrives makes the
// others fail with a timeout error instead of hanging. At rendezvous the
// ranks also tell each other which host they run on (host name and boot id),
// so grouping by host does not depend on what a launcher exports.
//
// Gloo's network interface: GLOO_SOCKET_IFNAME when set; otherwise, when
// MASTER_ADDR is not a loopback address, the interface whose route reaches
// MASTER_ADDR (as NCCL picks its socket interface); loopback when the whole
// job runs on one host. A job on several hosts whose rendezvous gives no way
// to find the interface (a loopback MASTER_ADDR, a FileStore) is an error
// that names GLOO_SOCKET_IFNAME.
#ifndef FSDP2_CORE_COMM_WORLD_H_
#define FSDP2_CORE_COMM_WORLD_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/backend.h"
#include "core/comm/process_group.h"

namespace fsdp2 {
namespace comm {

struct RendezvousOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // When set, rendezvous through a FileStore at this path instead of TCP.
  std::string store_path;
  // Applies to the rendezvous and to every collective.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  Backend backend = Backend::kGloo;  // kNccl: CUDA builds only

  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, FSDP2_STORE_PATH,
  // FSDP2_TIMEOUT_S and FSDP2_BACKEND ("gloo" or "nccl"), each optional
  // (defaults above). Throws std::invalid_argument on malformed values.
  static RendezvousOptions FromEnv();
};

class World {
 public:
  // Joins the job: connects to the store, checks the world size and builds
  // the group of all ranks. Throws std::runtime_error on failure or timeout.
  static std::shared_ptr<World> Init(const RendezvousOptions& options);

  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const;
  int size() const;
  const RendezvousOptions& options() const;

  // The group of all ranks.
  const std::shared_ptr<ProcessGroup>& group() const;

  // The host of every world rank ("name/boot-id"), exchanged at rendezvous;
  // hosts()[rank()] is this one. Ranks with the same entry share a kernel
  // (and /dev/shm).
  const std::vector<std::string>& hosts() const;
  int num_hosts() const;
  // The host name part of hosts()[rank], for messages.
  std::string host_name(int rank) const;
  // Where this rank's Gloo connections go: "GLOO_SOCKET_IFNAME=eth1",
  // "route to MASTER_ADDR via eth0 (10.0.0.2)" or "loopback"; empty for
  // other backends.
  const std::string& network() const;

  // Collective over all ranks: every rank calls it with the same arguments in
  // the same order. `partition` lists disjoint sets of world ranks; the group
  // of the set that holds this rank is returned (nullptr if none does).
  std::shared_ptr<ProcessGroup> new_groups(
      const std::vector<std::vector<int>>& partition, const std::string& name);

  // The store that holds the rendezvous, for small control messages.
  void store_set(const std::string& key, const std::string& value);
  std::string store_get(const std::string& key);  // waits up to the timeout

 private:
  struct Impl;
  explicit World(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_WORLD_H_
