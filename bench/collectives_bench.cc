// fsdp2/bench/collectives_bench.cc
//
// Bandwidth of the engine's collectives over one process group against a
// plain all-reduce of the same bytes over the same group, side by side in
// one run, through the shared-memory transport and then through Gloo alone
// (FSDP2_SHM=0):
//   all-gather       all_gather_pieces, the engine's unshard
//   reduce-scatter   reduce_scatter_flat as the engine calls it (kAuto)
//   rs ring (Gloo)   the ring of Gloo send/recv, for comparison
//   all-reduce       all_reduce
// for several sizes. Prints bus bandwidth (GB/s, as nccl-tests computes it)
// and median time, and the ratios all-gather / all-reduce and
// reduce-scatter / all-reduce of bus bandwidth (1.0: as efficient per byte
// as the all-reduce).
//
//   bazel run //bench:collectives -- --nproc 2
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "core/comm/world.h"
#include "core/launch/local_launcher.h"
#include "examples/flags/flags.h"

using namespace fsdp2;

namespace {

double MedianMs(comm::ProcessGroup& g, int reps, const std::function<void()>& op) {
  std::vector<double> ms;
  op();  // warm-up
  for (int i = 0; i < reps; ++i) {
    g.barrier().wait();
    auto start = std::chrono::steady_clock::now();
    op();
    ms.push_back(std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  // Every rank reports the slowest rank's median.
  at::Tensor t = at::full({1}, ms[ms.size() / 2], at::kDouble);
  g.all_reduce(t, comm::ReduceOp::kMax).wait();
  return t.item<double>();
}

// Bus bandwidth in GB/s, as nccl-tests reports it: the bytes each rank
// must move for `bytes` of collective (all-gather / reduce-scatter:
// (W-1)/W of the full buffer; all-reduce: twice that) over the time.
double BusGBs(double bytes, double factor, double ms) {
  return bytes * factor / (ms * 1e-3) / 1e9;
}

int RunRank(int reps) {
  at::set_num_threads(1);
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  auto& g = *world->group();
  const int W = g.size();
  const char* shm_env = std::getenv("FSDP2_SHM");
  const bool shm = shm_env == nullptr || std::string(shm_env) != "0";
  if (world->rank() == 0) {
    std::printf("\n%s, %d ranks, fp32, median of %d; bus bandwidth in GB/s "
                "(nccl-tests' busbw) and ms\n",
                shm ? "shared memory (the default for local ranks)"
                    : "Gloo over loopback TCP (FSDP2_SHM=0)",
                W, reps);
    std::printf("%9s | %18s | %18s | %18s | %18s | %9s %9s\n", "MiB", "all-gather",
                "reduce-scatter", "rs ring (Gloo)", "all-reduce", "AG / AR", "RS / AR");
  }
  for (int64_t mib : {1, 4, 16, 64}) {
    const int64_t n = mib * (1 << 20) / 4;  // elements of the full buffer
    const int64_t chunk = n / W;
    const double bytes = static_cast<double>(chunk * W) * 4;
    const double ag_factor = double(W - 1) / W, ar_factor = 2.0 * (W - 1) / W;
    at::Tensor input = at::randn({chunk * W});
    at::Tensor scratch = at::empty_like(input), out = at::empty({chunk});
    at::Tensor gathered = at::empty({chunk * W});
    // The engine's all-gather: in place into the unsharded layout.
    const double ag = MedianMs(g, reps, [&] {
      g.all_gather_pieces(gathered, {{0, chunk}}).wait();
    });
    auto rs = [&](comm::ReduceScatterAlgorithm algo) {
      return MedianMs(g, reps, [&] {
        scratch.copy_(input);
        g.reduce_scatter_flat(out, scratch, comm::Lane::kGradient, algo).wait();
      });
    };
    const double rs_auto = rs(comm::ReduceScatterAlgorithm::kAuto);
    const double rs_ring = rs(comm::ReduceScatterAlgorithm::kRing);
    const double ar = MedianMs(g, reps, [&] {
      scratch.copy_(input);
      g.all_reduce(scratch).wait();
    });
    if (world->rank() == 0) {
      auto cell = [&](double factor, double ms) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%6.2f GB/s %6.2f ms",
                      BusGBs(bytes, factor, ms), ms);
        return std::string(buf);
      };
      std::printf("%9lld | %s | %s | %s | %s | %9.2f %9.2f\n", (long long)mib,
                  cell(ag_factor, ag).c_str(), cell(ag_factor, rs_auto).c_str(),
                  cell(ag_factor, rs_ring).c_str(), cell(ar_factor, ar).c_str(),
                  BusGBs(bytes, ag_factor, ag) / BusGBs(bytes, ar_factor, ar),
                  BusGBs(bytes, ag_factor, rs_auto) / BusGBs(bytes, ar_factor, ar));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 2, reps = 10;
  try {
    flags::Flags flags(argc, argv,
                       "usage: bazel run -c opt //bench:collectives -- [--flag value ...]\n");
    nproc = flags.Int("nproc", nproc, "ranks");
    reps = flags.Int("reps", reps, "timed repetitions of each collective and size");
    flags.Finish();
  } catch (const flags::FlagError& e) {
    std::cerr << "collectives: " << e.what() << "\n";
    return 2;
  }
  try {
    if (!launch::IsRankProcess()) {
      // The same collectives through both transports, one after the other.
      for (const char* shm : {"1", "0"}) {
        launch::LocalLaunchOptions o;
        o.nproc = nproc;
        o.threads_per_rank = 1;
        o.argv.assign(argv, argv + argc);
        o.env["FSDP2_SHM"] = shm;
        if (int rc = launch::LaunchLocal(o); rc != 0) return rc;
      }
      return 0;
    }
    return RunRank(reps);
  } catch (const std::exception& e) {
    std::cerr << "collectives: " << e.what() << "\n";
    return 1;
  }
}
