// fsdp2/bench/bench_util.h
//
// What the training benchmarks share: running one configuration as N local
// ranks of this same binary and reading back what its rank 0 measured, and
// small helpers (medians, resident memory). Flags: examples/flags.
//
// A configuration runs in fresh processes (LaunchLocal), so every
// configuration starts from the same state: no allocator or thread pool
// warmed by an earlier one. Rank 0 writes its results as "key value" lines
// to the file named by FSDP2_BENCH_OUT; the parent reads them.
#ifndef FSDP2_BENCH_BENCH_UTIL_H_
#define FSDP2_BENCH_BENCH_UTIL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/models/gpt.h"
#include "examples/flags/flags.h"

namespace fsdp2 {
namespace bench {

// "key value" results of one configuration; values may repeat a key
// (e.g. one step time per line), in the order written.
using Results = std::multimap<std::string, std::string>;

// Runs this binary as `nproc` local ranks with `threads` threads each and
// the extra arguments `args`. Returns rank 0's results. Throws
// std::runtime_error (naming the configuration) if a rank fails.
Results RunConfiguration(const std::string& self, int nproc, int threads,
                         const std::vector<std::string>& args);

// In a rank process: the threads the local launcher gave each rank
// (FSDP2_THREADS; 1 where unset).
int ThreadsFromLauncher();

// In a rank process: appends "key value" to the results file (rank 0 only
// calls it). No-op when FSDP2_BENCH_OUT is unset.
void WriteResult(const std::string& key, const std::string& value);
void WriteResult(const std::string& key, double value);

// All values of `key` as numbers; the first one, or `fallback`.
std::vector<double> Values(const Results& r, const std::string& key);
double Value(const Results& r, const std::string& key, double fallback = 0);

double Median(std::vector<double> v);

// This process's resident set now and its high-water mark, in bytes
// (VmRSS, VmHWM from /proc/self/status).
int64_t ResidentBytes();
int64_t PeakResidentBytes();
// Resets the high-water mark to the current resident set (Linux >= 4.0,
// /proc/self/clear_refs); returns false if the kernel refused.
bool ResetPeakResidentBytes();

// The 85M GPT the benchmarks share: GPT-2 small's 12 blocks of width 768
// (12 heads), a 256-token vocabulary and 128-token sequences.
models::GPTConfig Gpt85M();

// The GPT's size flags (--n-layer, --n-embd, --n-head, --block-size,
// --vocab-size), `defaults` where one is not given. Throws
// std::invalid_argument for an invalid model (GPTConfig::Validate) and
// flags::FlagError for a value that is not a whole number.
models::GPTConfig ReadGPTConfig(flags::Flags& flags, const models::GPTConfig& defaults);
// Those flags with `config`'s values, for a rank's command line.
std::vector<std::string> GPTConfigArgs(const models::GPTConfig& config);

// The machine's logical CPU count.
int Cores();

// The `uptime` load averages, for the report header.
std::string LoadAverage();

}  // namespace bench
}  // namespace fsdp2

#endif  // FSDP2_BENCH_BENCH_UTIL_H_
