// fsdp2/core/comm/internal/host_exchange.h
//
// The rendezvous step in which every rank learns which host each rank runs
// on, in a number of store requests that grows linearly with the world
// size: each rank appends its record to one list and counts itself in one
// counter; the last to arrive publishes one packed table, which every rank
// reads once. (Polling `check` over every rank's key, as before, costs N^2
// requests: 9 s at 512 simulated ranks on one store, bench/store_scale.)
// Internal to core/comm.
#ifndef FSDP2_CORE_COMM_INTERNAL_HOST_EXCHANGE_H_
#define FSDP2_CORE_COMM_INTERNAL_HOST_EXCHANGE_H_

#include <chrono>
#include <string>
#include <vector>

#include "core/comm/internal/c10d.h"

namespace fsdp2 {
namespace comm {
namespace internal {

// Collective over the `world` ranks sharing `store`: publishes `identity`
// (HostIdentity(), or a stand-in in tests) as this rank's and returns every
// rank's, indexed by rank. Each rank makes 4 store requests and reads the
// table once (its size: the distinct identities plus one index per rank).
// Throws fsdp2::TimeoutError naming the ranks that did not arrive within
// `timeout` (rank 0, which serves a TCPStore, waits 2 s longer so that the
// others can still ask it who is missing), and fsdp2::CommunicationError
// when the store's server went away meanwhile (on ranks other than 0).
// A rank counted twice (two processes started with one RANK) is named too.
std::vector<std::string> ExchangeHosts(::c10d::Store& store, int rank, int world,
                                       const std::string& identity,
                                       std::chrono::milliseconds timeout);

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2

#endif  // FSDP2_CORE_COMM_INTERNAL_HOST_EXCHANGE_H_
