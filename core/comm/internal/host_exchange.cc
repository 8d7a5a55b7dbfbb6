#include "core/comm/internal/host_exchange.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <sstream>
#include <stdexcept>

#include "core/comm/internal/store_bytes.h"
#include "core/common/error.h"

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

// Every rank's record, "<rank> <identity>\n", appended in arrival order.
const char kArrivals[] = "fsdp2/hosts/arrivals";
// How many ranks have appended theirs.
const char kCount[] = "fsdp2/hosts/count";
// Written once, by the rank that counts the last arrival: the packed table
// (see PackTable), or "!" and why the ranks cannot go on.
const char kTable[] = "fsdp2/hosts/table";

// What the arrivals list says: each rank's identity ("" where it has not
// arrived) and the ranks with more than one record.
struct Arrivals {
  std::vector<std::string> identity;
  std::vector<int> missing, twice;
};

Arrivals ParseArrivals(const std::string& text, int world) {
  Arrivals a;
  a.identity.resize(world);
  std::vector<int> records(world, 0);
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    const int r = std::stoi(line.substr(0, space));
    if (r < 0 || r >= world) continue;
    if (records[r]++ == 0) a.identity[r] = line.substr(space + 1);
  }
  for (int r = 0; r < world; ++r) {
    if (records[r] == 0) a.missing.push_back(r);
    if (records[r] > 1) a.twice.push_back(r);
  }
  return a;
}

// The distinct identities, one a line in order of their first rank, then
// "#" and each rank's index among them: a host's name and boot id travel
// once, not once per rank.
std::string PackTable(const std::vector<std::string>& identity) {
  std::map<std::string, int> index;
  std::ostringstream hosts, ranks;
  ranks << "#";
  for (size_t r = 0; r < identity.size(); ++r) {
    auto [it, added] = index.emplace(identity[r], static_cast<int>(index.size()));
    if (added) hosts << identity[r] << "\n";
    ranks << (r ? " " : "") << it->second;
  }
  return hosts.str() + ranks.str();
}

std::vector<std::string> UnpackTable(const std::string& table, int world) {
  std::vector<std::string> distinct;
  std::istringstream lines(table);
  std::string line;
  while (std::getline(lines, line) && (line.empty() || line[0] != '#')) {
    distinct.push_back(line);
  }
  // Every rank reads all N indices: from_chars, not a stream (3x faster,
  // 0.35 ms at N = 4,096).
  std::vector<std::string> identity;
  identity.reserve(world);
  const char* p = line.data() + (line.empty() ? 0 : 1);
  const char* const end = line.data() + line.size();
  while (p < end) {
    size_t i = 0;
    const auto [next, error] = std::from_chars(p, end, i);
    if (error != std::errc() || i >= distinct.size()) break;
    identity.push_back(distinct[i]);
    p = next + 1;
  }
  if (static_cast<int>(identity.size()) != world) {
    throw CommunicationError("the rendezvous's host table names " +
                             std::to_string(identity.size()) + " ranks, not " +
                             std::to_string(world));
  }
  return identity;
}

// "rank 3" or "ranks 1, 3".
std::string RankList(const std::vector<int>& ranks) {
  std::ostringstream s;
  s << "rank" << (ranks.size() > 1 ? "s " : " ");
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
  return s.str();
}

std::string Twice(const Arrivals& a) {
  return RankList(a.twice) + " arrived twice (two processes started with one RANK?)";
}

}  // namespace

std::vector<std::string> ExchangeHosts(::c10d::Store& store, int rank, int world,
                                       const std::string& identity,
                                       std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout +
                        (rank == 0 ? std::chrono::seconds(2) : std::chrono::seconds(0));
  store.append(kArrivals, Bytes(std::to_string(rank) + " " + identity + "\n"));
  if (store.add(kCount, 1) == world) {
    const Arrivals a = ParseArrivals(String(store.get(kArrivals)), world);
    store.set(kTable, Bytes(a.twice.empty() ? PackTable(a.identity)
                                            : "!" + Twice(a) + " and " +
                                                  RankList(a.missing) + " did not"));
  }
  try {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    store.wait({kTable}, std::max(left, std::chrono::milliseconds(1)));
  } catch (const std::exception& e) {
    // Timed out, or the store's server went away: who is missing, if the
    // server still answers (one request, on this failure path only).
    Arrivals a;
    try {
      a = ParseArrivals(String(store.get(kArrivals)), world);
    } catch (const std::exception&) {
      if (rank == 0) throw;
      throw CommunicationError(
          std::string(e.what()) + " (the store's server, rank 0, went away while "
          "the ranks were meeting: it gave up waiting or exited; see its error)");
    }
    // Everyone arrived, but the rank that counted the last arrival left
    // before publishing the table: the list says as much.
    if (a.missing.empty() && a.twice.empty()) return a.identity;
    if (a.missing.empty()) throw CommunicationError(Twice(a));
    throw TimeoutError(
        RankList(a.missing) + " of " + std::to_string(world) + " did not arrive within " +
        std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) +
        " s (not started, or started with another MASTER_ADDR, MASTER_PORT or WORLD_SIZE)");
  }
  const std::string table = String(store.get(kTable));
  if (!table.empty() && table[0] == '!') throw CommunicationError(table.substr(1));
  return UnpackTable(table, world);
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
