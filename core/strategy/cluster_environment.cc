#include "core/strategy/cluster_environment.h"
#include "core/common/error.h"

#include <map>
#include <sstream>
#include <stdexcept>

namespace fsdp2 {
namespace strategy {
namespace {

struct Env {
  const ClusterEnvironment::Getenv& getenv;

  bool has(const char* name) const {
    const char* v = getenv(name);
    return v != nullptr && *v != '\0';
  }
  std::string str(const char* name, const std::string& fallback = "") const {
    return has(name) ? std::string(getenv(name)) : fallback;
  }
  int integer(const char* name, int fallback) const {
    if (!has(name)) return fallback;
    const std::string value = getenv(name);
    try {
      size_t used = 0;
      long long parsed = std::stoll(value, &used);
      if (used != value.size() || parsed < 0 || parsed > (1 << 30)) {
        throw InvalidArgumentError("");
      }
      return static_cast<int>(parsed);
    } catch (const std::exception&) {
      throw InvalidArgumentError(std::string("environment variable ") + name +
                                  "='" + value +
                                  "' is not a non-negative integer");
    }
  }
};

}  // namespace

const char* ToString(ClusterKind kind) {
  switch (kind) {
    case ClusterKind::kLocal: return "local";
    case ClusterKind::kTorchElastic: return "torchelastic";
    case ClusterKind::kSlurm: return "slurm";
    case ClusterKind::kOpenMPI: return "openmpi";
  }
  return "?";
}

std::string FirstSlurmHost(const std::string& nodelist) {
  // Up to the first ',' outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  const auto open = first.find('[');
  if (open == std::string::npos) return first;
  const std::string prefix = first.substr(0, open);
  std::string range = first.substr(open + 1);
  range = range.substr(0, range.find_first_of(",]"));
  return prefix + range.substr(0, range.find('-'));
}

ClusterEnvironment ClusterEnvironment::Detect(const Getenv& getenv) {
  Env env{getenv};
  ClusterEnvironment c;
  if (env.has("RANK") || env.has("WORLD_SIZE")) {
    if (!env.has("RANK") || !env.has("WORLD_SIZE")) {
      throw InvalidArgumentError(
          "RANK and WORLD_SIZE must be set together (torchrun-style launch)");
    }
    c.kind = ClusterKind::kTorchElastic;
    c.rank = env.integer("RANK", 0);
    c.world_size = env.integer("WORLD_SIZE", 1);
    c.local_rank = env.integer("LOCAL_RANK", c.rank);
    c.node_rank = env.integer("GROUP_RANK", env.integer("NODE_RANK", 0));
  } else if (env.has("SLURM_PROCID") && env.has("SLURM_NTASKS")) {
    c.kind = ClusterKind::kSlurm;
    c.rank = env.integer("SLURM_PROCID", 0);
    c.world_size = env.integer("SLURM_NTASKS", 1);
    c.local_rank = env.integer("SLURM_LOCALID", 0);
    c.node_rank = env.integer("SLURM_NODEID", 0);
    const std::string nodes =
        env.str("SLURM_JOB_NODELIST", env.str("SLURM_NODELIST"));
    if (!nodes.empty()) c.master_addr = FirstSlurmHost(nodes);
    // A port derived from the job id, so concurrent jobs on a node differ.
    c.master_port = 15000 + env.integer("SLURM_JOB_ID", 0) % 5000;
  } else if (env.has("OMPI_COMM_WORLD_RANK") &&
             env.has("OMPI_COMM_WORLD_SIZE")) {
    c.kind = ClusterKind::kOpenMPI;
    c.rank = env.integer("OMPI_COMM_WORLD_RANK", 0);
    c.world_size = env.integer("OMPI_COMM_WORLD_SIZE", 1);
    c.local_rank = env.integer("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    const int local_size = env.integer("OMPI_COMM_WORLD_LOCAL_SIZE", c.world_size);
    c.node_rank = local_size > 0 ? c.rank / local_size : 0;
    if (local_size < c.world_size && !env.has("MASTER_ADDR")) {
      throw InvalidArgumentError(
          "mpirun across several nodes: set MASTER_ADDR (and MASTER_PORT) to "
          "the host of rank 0, e.g. mpirun -x MASTER_ADDR=host0");
    }
  }
  c.master_addr = env.str("MASTER_ADDR", c.master_addr);
  c.store_path = env.str("FSDP2_STORE_PATH");
  c.master_port = env.integer("MASTER_PORT", c.master_port);
  if (c.world_size < 1 || c.rank >= c.world_size) {
    std::ostringstream msg;
    msg << strategy::ToString(c.kind) << " environment gives rank " << c.rank
        << " in a world of " << c.world_size
        << " (need 0 <= rank < world size)";
    throw InvalidArgumentError(msg.str());
  }
  if (c.master_port < 1 || c.master_port > 65535) {
    throw InvalidArgumentError("MASTER_PORT " + std::to_string(c.master_port) +
                                " is not a TCP port");
  }
  return c;
}

comm::RendezvousOptions ClusterEnvironment::ToRendezvous(
    std::chrono::milliseconds timeout, comm::Backend backend) const {
  comm::RendezvousOptions o;
  o.rank = rank;
  o.world_size = world_size;
  o.master_addr = master_addr;
  o.master_port = master_port;
  o.store_path = store_path;
  o.timeout = timeout;
  o.backend = backend;
  return o;
}

std::string ClusterEnvironment::ToString() const {
  std::ostringstream s;
  s << strategy::ToString(kind) << "(rank=" << rank << ", world_size=" << world_size
    << ", local_rank=" << local_rank << ", node_rank=" << node_rank
    << ", master=" << master_addr << ":" << master_port << ")";
  return s.str();
}

int RanksPerHost(const std::vector<std::string>& hosts) {
  const int world = static_cast<int>(hosts.size());
  if (world == 0) throw InvalidArgumentError("RanksPerHost: no ranks");
  auto name = [&](int r) {
    const std::string& h = hosts[static_cast<size_t>(r)];
    return "'" + h.substr(0, h.find('/')) + "'";
  };
  std::map<std::string, int> count;
  for (const auto& h : hosts) ++count[h];
  const int per_host = count[hosts[0]];
  for (int r = 0; r < world; ++r) {
    if (count[hosts[static_cast<size_t>(r)]] != per_host) {
      throw InvalidArgumentError(
          "HYBRID_SHARD shards within each host, but the hosts run different "
          "numbers of ranks (host " + name(0) + ": " + std::to_string(per_host) +
          ", host " + name(r) + ": " +
          std::to_string(count[hosts[static_cast<size_t>(r)]]) +
          "); start as many ranks on every host, or set shard_group_size to "
          "a divisor of the world size");
    }
  }
  for (int r = 0; r < world; ++r) {
    const int first = r - r % per_host;
    if (hosts[static_cast<size_t>(r)] != hosts[static_cast<size_t>(first)]) {
      throw InvalidArgumentError(
          "HYBRID_SHARD shards within each host, but the ranks of one host are "
          "not consecutive (rank " + std::to_string(first) + " runs on " +
          name(first) + ", rank " + std::to_string(r) + " on " + name(r) +
          "); number the ranks host by host (srun --distribution=block, "
          "mpirun --map-by slot), or set shard_group_size");
    }
  }
  return per_host;
}

}  // namespace strategy
}  // namespace fsdp2
