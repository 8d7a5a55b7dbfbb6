// fsdp2/bench/collectives_bench.cc
//
// Bandwidth of the engine's collectives over one process group, side by side
// in one run:
//   all_gather_into_flat   (ring of send/recv on Gloo)
//   reduce_scatter_flat    ring (send/recv) vs all-reduce + keep own slice
//   all_reduce             (the backend's own)
// for several message sizes. Prints the median time of each, the bytes each
// rank sent, and the ratio ring reduce-scatter / (all-reduce + slice).
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

int RunRank(int reps) {
  at::set_num_threads(1);
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  auto& g = *world->group();
  const int W = g.size();
  if (world->rank() == 0) {
    std::printf("collectives over %d ranks (Gloo, loopback), fp32, median of %d\n", W, reps);
    std::printf("%10s | %12s | %12s %12s %8s | %12s | %s\n", "MiB/rank", "all_gather",
                "rs ring", "rs allreduce", "ratio", "all_reduce", "sent MiB/rank ring vs allreduce");
  }
  for (int64_t mib : {1, 4, 16, 64}) {
    const int64_t n = mib * (1 << 20) / 4;  // elements of the full input
    const int64_t chunk = n / W;
    at::Tensor input = at::randn({chunk * W});
    at::Tensor scratch = at::empty_like(input), out = at::empty({chunk});
    at::Tensor gathered = at::empty({chunk * W});
    const double ag = MedianMs(g, reps, [&] {
      g.all_gather_into_flat(gathered, input.narrow(0, 0, chunk)).wait();
    });
    auto rs = [&](comm::ReduceScatterAlgorithm algo) {
      return MedianMs(g, reps, [&] {
        scratch.copy_(input);
        g.reduce_scatter_flat(out, scratch, comm::Lane::kGradient, algo).wait();
      });
    };
    int64_t before = g.bytes_sent();
    const double ring = rs(comm::ReduceScatterAlgorithm::kRing);
    const int64_t ring_bytes = (g.bytes_sent() - before) / (reps + 1);
    before = g.bytes_sent();
    const double viaar = rs(comm::ReduceScatterAlgorithm::kAllReduce);
    const int64_t ar_bytes = (g.bytes_sent() - before) / (reps + 1);
    const double ar = MedianMs(g, reps, [&] {
      scratch.copy_(input);
      g.all_reduce(scratch).wait();
    });
    if (world->rank() == 0) {
      std::printf("%10lld | %9.2f ms | %9.2f ms %9.2f ms %8.2f | %9.2f ms | %.2f vs %.2f\n",
                  (long long)mib, ag, ring, viaar, ring / viaar, ar,
                  ring_bytes / 1048576.0, ar_bytes / 1048576.0);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 2, reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--nproc") nproc = std::atoi(argv[i + 1]);
    else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else { std::cerr << "collectives: unknown flag " << flag << "\n"; return 2; }
  }
  try {
    if (!launch::IsRankProcess()) {
      launch::LocalLaunchOptions o;
      o.nproc = nproc;
      o.threads_per_rank = 1;
      o.argv.assign(argv, argv + argc);
      return launch::LaunchLocal(o);
    }
    return RunRank(reps);
  } catch (const std::exception& e) {
    std::cerr << "collectives: " << e.what() << "\n";
    return 1;
  }
}
