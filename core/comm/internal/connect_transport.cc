#include "core/comm/internal/connect_transport.h"
#include "core/common/error.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "core/comm/internal/gloo_transport.h"
#include "core/comm/internal/host.h"
#include "core/comm/internal/nccl_transport.h"
#include "core/comm/internal/shm_segment.h"
#include "core/comm/internal/shm_transport.h"
#include "core/comm/internal/single_rank_transport.h"
#include "core/comm/internal/staged_transport.h"
#include "core/comm/internal/store_bytes.h"

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

// Collective: whether the group may use shared memory, decided alike on
// every rank: only if all of them run on this host and none has FSDP2_SHM=0
// in its environment.
bool SharedMemoryAgreed(::c10d::Store& store, int rank, int world) {
  const char* env = std::getenv("FSDP2_SHM");
  const bool enabled = env == nullptr || std::string(env) != "0";
  store.set("fsdp2_shm/host/" + std::to_string(rank),
            Bytes(HostIdentity() + (enabled ? "/on" : "/off")));
  bool usable = enabled;
  const std::string mine = HostIdentity() + "/on";
  // Two requests per rank (a wait the server answers when all are there,
  // one read of them all), not one per peer: N, not N^2, at the server.
  std::vector<std::string> keys;
  for (int k = 0; k < world; ++k) keys.push_back("fsdp2_shm/host/" + std::to_string(k));
  store.wait(keys);
  for (const auto& host : store.multiGet(keys)) {
    if (String(host) != mine) usable = false;
  }
  return usable;
}

}  // namespace

std::unique_ptr<Transport> ConnectTransport(const TransportOptions& options) {
  if (options.world == 1) return std::make_unique<SingleRankTransport>();
  RequireBuilt(options.backend);
#ifdef USE_C10D_NCCL
  if (options.backend == Backend::kNccl) {
    return std::move(ConnectLanes(options, /*lanes=*/1).front());
  }
#endif
  // Host transports, staged through host copies for device tensors (ranks
  // sharing a GPU, or a gloo group on GPUs).
  std::unique_ptr<Transport> gloo =
      GlooTransport::Connect(options.store, options.rank, options.world,
                             options.gloo_device, options.timeout);
  if (!SharedMemoryAgreed(*options.store, options.rank, options.world)) {
    return StagedTransport::ThroughHost(std::move(gloo));
  }
  std::unique_ptr<ShmSegment> segment =
      ShmSegment::Create(*options.store, options.rank, options.world,
                         kShmSlotBytes, options.timeout);
  if (segment == nullptr) return StagedTransport::ThroughHost(std::move(gloo));
  return StagedTransport::ThroughHost(
      std::make_unique<ShmTransport>(std::move(segment), std::move(gloo)));
}

std::vector<std::unique_ptr<Transport>> ConnectLanes(const TransportOptions& options,
                                                     int lanes) {
  std::vector<std::unique_ptr<Transport>> transports;
#ifdef USE_C10D_NCCL
  if (options.world > 1 && options.backend == Backend::kNccl) {
    // CPU tensors travel through copies on the group's GPU.
    for (auto& t : NcclTransport::ConnectLanes(options.store, options.rank, options.world,
                                               options.timeout, lanes)) {
      const at::Device gpu = t->device();
      transports.push_back(StagedTransport::ThroughDevice(std::move(t), gpu));
    }
    return transports;
  }
#endif
  for (int lane = 0; lane < lanes; ++lane) {
    TransportOptions own = options;
    own.store = c10::make_intrusive<::c10d::PrefixStore>(std::to_string(lane), options.store);
    transports.push_back(ConnectTransport(own));
  }
  return transports;
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
