#include "bench/bench_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "core/launch/local_launcher.h"

namespace fsdp2 {
namespace bench {

Results RunConfiguration(const std::string& self, int nproc, int threads,
                         const std::vector<std::string>& args) {
  char path[] = "/tmp/fsdp2-bench-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) throw std::runtime_error("cannot create a results file in /tmp");
  close(fd);
  launch::LocalLaunchOptions options;
  options.nproc = nproc;
  options.threads_per_rank = threads;
  options.argv.push_back(self);
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.env["FSDP2_BENCH_OUT"] = path;
  const int rc = launch::LaunchLocal(options);
  Results results;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto space = line.find(' ');
    if (space == std::string::npos) continue;
    results.emplace(line.substr(0, space), line.substr(space + 1));
  }
  std::remove(path);
  if (rc != 0) {
    std::ostringstream what;
    what << "configuration failed (exit " << rc << "): " << nproc << " ranks:";
    for (const auto& a : args) what << " " << a;
    throw std::runtime_error(what.str());
  }
  return results;
}

int ThreadsFromLauncher() {
  const char* env = std::getenv("FSDP2_THREADS");
  return env ? std::max(1, std::atoi(env)) : 1;
}

void WriteResult(const std::string& key, const std::string& value) {
  const char* path = std::getenv("FSDP2_BENCH_OUT");
  if (path == nullptr) return;
  std::ofstream out(path, std::ios::app);
  out << key << " " << value << "\n";
}

void WriteResult(const std::string& key, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", value);
  WriteResult(key, std::string(buf));
}

std::vector<double> Values(const Results& r, const std::string& key) {
  std::vector<double> out;
  auto range = r.equal_range(key);
  for (auto it = range.first; it != range.second; ++it) {
    out.push_back(std::stod(it->second));
  }
  return out;
}

double Value(const Results& r, const std::string& key, double fallback) {
  auto it = r.find(key);
  return it == r.end() ? fallback : std::stod(it->second);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

int64_t StatusKiB(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      return std::atoll(line.c_str() + field.size() + 1);
    }
  }
  return 0;
}

}  // namespace

int64_t ResidentBytes() { return StatusKiB("VmRSS") * 1024; }
int64_t PeakResidentBytes() { return StatusKiB("VmHWM") * 1024; }

bool ResetPeakResidentBytes() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

models::GPTConfig Gpt85M() {
  models::GPTConfig c;
  c.n_layer = 12;
  c.n_embd = 768;
  c.n_head = 12;
  c.block_size = 128;
  c.vocab_size = 256;
  return c;
}

models::GPTConfig ReadGPTConfig(flags::Flags& flags, const models::GPTConfig& defaults) {
  models::GPTConfig c;
  c.n_layer = flags.Int("n-layer", defaults.n_layer, "transformer blocks");
  c.n_embd = flags.Int("n-embd", defaults.n_embd, "embedding width");
  c.n_head = flags.Int("n-head", defaults.n_head, "attention heads");
  c.block_size = flags.Int("block-size", defaults.block_size, "tokens per sequence");
  c.vocab_size = flags.Int("vocab-size", defaults.vocab_size, "vocabulary");
  c.Validate();
  return c;
}

std::vector<std::string> GPTConfigArgs(const models::GPTConfig& c) {
  return {"--n-layer",    std::to_string(c.n_layer),    "--n-embd",
          std::to_string(c.n_embd), "--n-head",         std::to_string(c.n_head),
          "--block-size", std::to_string(c.block_size), "--vocab-size",
          std::to_string(c.vocab_size)};
}

int Cores() {
  return std::max(1u, std::thread::hardware_concurrency());
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  in >> a >> b >> c;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.2f %.2f %.2f (1, 5, 15 min)", a, b, c);
  return buf;
}

}  // namespace bench
}  // namespace fsdp2
