#include "core/comm/world.h"
#include "core/common/error.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "core/comm/internal/c10d.h"
#include "core/comm/internal/connect_transport.h"
#include "core/comm/internal/host.h"
#include "core/comm/internal/host_exchange.h"
#include "core/comm/internal/process_group_impl.h"
#include "core/comm/internal/store_bytes.h"

namespace fsdp2 {
namespace comm {
namespace {

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (*end != '\0') {
    throw InvalidArgumentError(std::string("environment variable ") + name +
                                "='" + value + "' is not an integer");
  }
  return static_cast<int>(parsed);
}

std::string EnvString(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return (value == nullptr || *value == '\0') ? fallback : std::string(value);
}

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// A client of the TCPStore at MASTER_ADDR:MASTER_PORT; on rank 0 (`server`)
// also its server. A process may create several Worlds (one strategy after
// another, or several at once): rank 0's server is started once per port
// and kept for the life of the process, and every later store of this
// process on that port is another client of it (c10d's multi-tenant
// stores). Stopping the server with its World would make the port busy for
// a World created while another lives (EADDRINUSE), or cut off the other
// ranks' clients of the next World that connected before rank 0 let go of
// the last one.
c10::intrusive_ptr<::c10d::Store> ConnectTcpStore(const RendezvousOptions& options, bool server) {
  ::c10d::TCPStoreOptions tcp;
  tcp.port = static_cast<uint16_t>(options.master_port);
  tcp.isServer = server;
  tcp.multiTenant = server;
  tcp.numWorkers = options.world_size;
  tcp.waitWorkers = false;
  tcp.timeout = options.timeout;
  auto store = c10::make_intrusive<::c10d::TCPStore>(options.master_addr, tcp);
  if (server) {
    static std::mutex mu;
    static auto* servers = new std::map<uint16_t, c10::intrusive_ptr<::c10d::TCPStore>>();
    std::lock_guard<std::mutex> lock(mu);
    servers->emplace(tcp.port, store);  // the first keeps the server running
  }
  return store;
}

// How many Worlds this process has created before on this rendezvous
// target (a store path, or MASTER_ADDR:MASTER_PORT), counting this one.
int64_t NextWorldNumber(const std::string& target) {
  static std::mutex mu;
  static auto* counts = new std::map<std::string, int64_t>();
  std::lock_guard<std::mutex> lock(mu);
  return (*counts)[target]++;
}

}  // namespace

RendezvousOptions RendezvousOptions::FromEnv() {
  RendezvousOptions o;
  o.rank = EnvInt("RANK", 0);
  o.world_size = EnvInt("WORLD_SIZE", 1);
  o.master_addr = EnvString("MASTER_ADDR", o.master_addr);
  o.master_port = EnvInt("MASTER_PORT", o.master_port);
  o.store_path = EnvString("FSDP2_STORE_PATH", "");
  o.timeout = std::chrono::seconds(EnvInt("FSDP2_TIMEOUT_S", 300));
  o.backend = ParseBackend(EnvString("FSDP2_BACKEND", ToString(o.backend)));
  return o;
}

struct World::Impl {
  RendezvousOptions options;
  c10::intrusive_ptr<::c10d::Store> store;
  std::shared_ptr<internal::GlooDevice> gloo_device;
  std::vector<std::string> hosts;
  int num_hosts = 1;
  std::string network;
  std::shared_ptr<internal::LostReport> lost_report;
  int groups_created = 0;
  std::string prefix;  // this World's keys in the store
};

World::World(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
World::~World() { group_.reset(); }

int World::rank() const { return impl_->options.rank; }
int World::size() const { return impl_->options.world_size; }
const RendezvousOptions& World::options() const { return impl_->options; }
const std::shared_ptr<ProcessGroup>& World::group() const { return group_; }
const std::vector<std::string>& World::hosts() const { return impl_->hosts; }
int World::num_hosts() const { return impl_->num_hosts; }
std::string World::host_name(int rank) const {
  return internal::HostName(impl_->hosts.at(rank));
}
const std::string& World::network() const { return impl_->network; }

void World::store_set(const std::string& key, const std::string& value) {
  impl_->store->set("fsdp2/user/" + key, internal::Bytes(value));
}

std::string World::store_get(const std::string& key) {
  return internal::String(impl_->store->get("fsdp2/user/" + key));
}

std::shared_ptr<World> World::Init(const RendezvousOptions& options) {
  const int rank = options.rank, world_size = options.world_size;
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    std::ostringstream msg;
    msg << "fsdp2: invalid rendezvous: rank " << rank << " with world size "
        << world_size << " (need 0 <= rank < world size)";
    throw InvalidArgumentError(msg.str());
  }
  RequireBuilt(options.backend);
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const std::string where = "fsdp2: rank " + std::to_string(rank) + ": ";
  // torchrun's agent serves a TCPStore on MASTER_PORT already and says so
  // (TORCHELASTIC_USE_AGENT_STORE=True): rank 0 connects to it too.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool tcp_server =
      rank == 0 && !(agent_store != nullptr && std::string(agent_store) == "True");
  // The ranks create their Worlds in the same order, so the n-th World of
  // each rank meets the others' n-th (see world.h). Its keys stay apart
  // from those of earlier Worlds, or of one alive: under a prefix of its
  // own in the TCPStore (rank 0's server, or torchrun's agent store, which
  // also keeps those of the processes of earlier attempts: the restart
  // count tells them apart), in a file of its own for a FileStore (which
  // deletes its file when the last rank lets go of it).
  const std::string target = options.store_path.empty()
                                 ? options.master_addr + ":" + std::to_string(options.master_port)
                                 : options.store_path;
  const int64_t number = world_size == 1 && options.store_path.empty() ? 0
                                                                        : NextWorldNumber(target);
  impl->prefix = "fsdp2/attempt" + EnvString("TORCHELASTIC_RESTART_COUNT", "0") + "/world" +
                 std::to_string(number);
  try {
    if (!options.store_path.empty()) {
      const std::string path =
          number == 0 ? options.store_path : options.store_path + ".world" + std::to_string(number);
      impl->store = c10::make_intrusive<::c10d::FileStore>(path, world_size);
    } else if (world_size == 1) {
      // Nobody to meet: an in-process store, no port at all (a notebook or
      // a sweep may hold several strategies, and other jobs may run).
      impl->store = c10::make_intrusive<::c10d::HashStore>();
    } else {
      impl->store = ConnectTcpStore(options, tcp_server);
    }
    impl->store->setTimeout(options.timeout);
    impl->store = c10::make_intrusive<::c10d::PrefixStore>(impl->prefix, impl->store);

    // Every rank must have been started with the same world size; rank 0
    // publishes its own and the others compare.
    if (rank == 0) {
      impl->store->set("fsdp2/world_size", internal::Bytes(std::to_string(world_size)));
    }
    int rank0_world = std::stoi(internal::String(impl->store->get("fsdp2/world_size")));
    if (rank0_world != world_size) {
      std::ostringstream msg;
      msg << "world size mismatch: this rank was started with WORLD_SIZE="
          << world_size << " but rank 0 with WORLD_SIZE=" << rank0_world;
      throw CommunicationError(msg.str());
    }
    // Which host every rank runs on.
    impl->hosts = internal::ExchangeHosts(*impl->store, rank, world_size,
                                          internal::HostIdentity(), options.timeout);
    std::map<std::string, int> per_host;
    for (const auto& h : impl->hosts) ++per_host[h];
    impl->num_hosts = static_cast<int>(per_host.size());
    if (world_size > 1) {
      // Over TCP its own connection: a TCPStore client is not safe for
      // concurrent use.
      c10::intrusive_ptr<::c10d::Store> watch_store = impl->store;  // FileStore locks each op
      if (options.store_path.empty()) {
        watch_store = c10::make_intrusive<::c10d::PrefixStore>(
            impl->prefix, ConnectTcpStore(options, /*server=*/false));
      }
      if (options.store_path.empty()) {
        // Woken through the world's store; its wait is renewed once a day.
        impl->lost_report = std::make_shared<internal::LostReport>(
            watch_store, rank, internal::LostReport::kWokenRenewal, impl->store);
      } else {
        impl->lost_report = std::make_shared<internal::LostReport>(
            watch_store, rank, std::chrono::seconds(1));
      }
    }
    if (options.backend == Backend::kGloo) {
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      if (ifname != nullptr && *ifname != '\0') {
        impl->gloo_device =
            internal::GlooDeviceForInterface(ifname);
        impl->network = std::string("GLOO_SOCKET_IFNAME=") + ifname;
      } else if (options.store_path.empty() &&
                 !IsLoopback(options.master_addr)) {
        // Rank 0's host is reachable at MASTER_ADDR (its store listens
        // there), so the interface that routes to it reaches the job.
        const internal::Route route = internal::RouteTo(options.master_addr);
        impl->gloo_device =
            internal::GlooDeviceForAddress(route.local_address);
        impl->network = "route to MASTER_ADDR via " +
                        (route.interface.empty() ? std::string("?") : route.interface) +
                        " (" + route.local_address + ")";
      } else if (impl->num_hosts > 1) {
        throw CommunicationError(
            "the job's " + std::to_string(world_size) + " ranks run on " +
            std::to_string(impl->num_hosts) + " hosts, but " +
            (options.store_path.empty()
                 ? "MASTER_ADDR=" + options.master_addr + " is a loopback address"
                 : "the rendezvous is a file store") +
            ", which says nothing about the network between them; set "
            "GLOO_SOCKET_IFNAME to the interface the hosts reach each other "
            "through (see `ip addr`), or MASTER_ADDR to rank 0's address on it");
      } else {
        impl->gloo_device =
            internal::GlooDeviceForAddress("127.0.0.1");
        impl->network = "loopback";
      }
    }
  } catch (const Error& e) {
    ThrowError(e.code(), where + "rendezvous failed: " + e.what());
  } catch (const c10::Error& e) {
    throw CommunicationError(where + "rendezvous failed: " +
                             e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw CommunicationError(where + "rendezvous failed: " + e.what());
  }
  std::shared_ptr<World> world(new World(std::move(impl)));
  std::vector<int> all(world_size);
  for (int i = 0; i < world_size; ++i) all[i] = i;
  world->group_ = world->new_groups({all}, "world");
  return world;
}

std::shared_ptr<ProcessGroup> World::new_groups(
    const std::vector<std::vector<int>>& partition, const std::string& name) {
  const int id = impl_->groups_created++;
  const int me = rank();
  for (size_t set = 0; set < partition.size(); ++set) {
    const auto& ranks = partition[set];
    int my_index = -1;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= size()) {
        throw InvalidArgumentError("fsdp2: group '" + name + "' names rank " +
                                    std::to_string(ranks[i]) +
                                    " outside the world");
      }
      if (ranks[i] == me) my_index = static_cast<int>(i);
    }
    if (my_index < 0) continue;

    auto impl = std::make_unique<ProcessGroup::Impl>();
    impl->name = name;
    impl->global_ranks = ranks;
    impl->rank = my_index;
    impl->world_rank = me;
    impl->backend = ToString(impl_->options.backend);
    impl->timeout = impl_->options.timeout;
    if (ranks.size() > 1) {
      impl->peer_check.store = impl_->store;
      impl->peer_check.world_rank = me;
      impl->peer_check.group_ranks = ranks;
      impl->peer_check.hosts = impl_->hosts;
      impl->peer_check.report = impl_->lost_report;
    }
    try {
      std::ostringstream prefix;
      prefix << "fsdp2/pg/" << id << "/" << set;
      internal::TransportOptions transport;
      transport.store = c10::make_intrusive<::c10d::PrefixStore>(prefix.str(), impl_->store);
      transport.rank = my_index;
      transport.world = static_cast<int>(ranks.size());
      transport.backend = impl_->options.backend;
      transport.gloo_device = impl_->gloo_device;
      transport.timeout = impl_->options.timeout;
      auto transports = internal::ConnectLanes(transport, kNumLanes);
      for (int lane = 0; lane < kNumLanes; ++lane) {
        impl->transports[lane] = std::move(transports[lane]);
        impl->lanes[lane] = std::make_unique<CommLane>(name);
      }
    } catch (const std::exception& e) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      throw CommunicationError(
          "fsdp2: rank " + std::to_string(me) + ": creating group '" + name +
          "' failed: " +
          (c10_error ? c10_error->what_without_backtrace() : e.what()));
    }
    return std::make_shared<ProcessGroup>(std::move(impl));
  }
  return nullptr;
}

}  // namespace comm
}  // namespace fsdp2
