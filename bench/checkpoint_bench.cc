// fsdp2/bench/checkpoint_bench.cc
//
// Checkpoint speed against the disk itself: `bazel run -c opt
// //bench:checkpoint -- [--dir D] [--nprocs 1,2,4]`.
//
// For each rank count N, N local ranks shard the 85M GPT (FULL_SHARD, one
// unit per block and the root), take one AdamW step so that the optimizer
// holds state, and then, in every repeat and in this order:
//   - the disk: each rank writes a plain file of its sharded file's size in
//     8 MiB writes and fsyncs it (N writers, as the sharded save has);
//   - a sharded save (every rank its own file, then metadata and the swap);
//   - the disk read back (N readers, 8 MiB reads) and a sharded load;
//   - the training thread's stall for a background sharded save (what
//     StageShardedCheckpoint takes before the write can go to a thread);
//   - the same for the full format: rank 0 alone writes a plain file of the
//     full checkpoint's size (one writer, as rank 0 gathers and writes), a
//     full save, rank 0 reads its file back, and a full load (all ranks
//     read their rows of the one file, after rank 0 has checked it);
//   - the parameters alone in Hugging Face's layout (hf_checkpoint.h, the
//     path a Llama's save_hf_checkpoint takes): a save, then a load (every
//     rank reads its rows of model.safetensors).
// Every time is the slowest rank's, from a barrier to the end. Before each
// read the files' pages are evicted from the page cache with
// posix_fadvise(POSIX_FADV_DONTNEED) after fdatasync (no root needed), and
// mincore() then measures what is still resident, printed beside the reads:
// a read from the page cache is not a read from the disk. The disk and the
// checkpoint alternate within each repeat, in the same directory, so a disk
// whose speed drifts (a shared virtual disk does) drifts for both; medians
// over the repeats are printed.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/ratio_chart.h"
#include "core/checkpoint/full_checkpoint.h"
#include "core/checkpoint/hf_checkpoint.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/sharded_checkpoint.h"
#include "core/comm/device_mesh.h"
#include "core/comm/world.h"
#include "core/fsdp/fully_shard.h"
#include "core/launch/local_launcher.h"
#include "core/models/gpt_module.h"
#include "examples/flags/flags.h"

namespace fsdp2 {
namespace bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* kUsage =
    "usage: bazel run -c opt //bench:checkpoint -- [--flag value ...]\n"
    "Sharded and full checkpoint save and load speed of the 85M GPT with AdamW\n"
    "state, beside the disk's own write and read speed in the same directory.\n";

constexpr size_t kChunk = 8 << 20;

[[noreturn]] void Fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(errno));
}

// Writes `bytes` bytes (not zeros: nothing below may shortcut them) in
// 8 MiB writes and fsyncs, as a plain program streaming a file out would.
void WriteDiskFile(const std::string& path, uint64_t bytes) {
  static const std::vector<char> chunk = [] {
    std::vector<char> c(kChunk);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (auto& b : c) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      b = static_cast<char>(x);
    }
    return c;
  }();
  unlink(path.c_str());
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Fail(path, "cannot create");
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, bytes - done));
    const ssize_t w = write(fd, chunk.data(), n);
    if (w <= 0) Fail(path, "write failed");
    done += static_cast<uint64_t>(w);
  }
  if (fsync(fd) != 0 || close(fd) != 0) Fail(path, "fsync failed");
}

// Reads the file in 8 MiB reads: into one reused buffer (`keep` false: the
// disk's speed, as dd measures it), or into fresh memory of the file's size
// (`keep` true: what any program that loads the file pays, its pages faulted
// in and zeroed by the kernel before the bytes land).
void ReadDiskFile(const std::string& path, bool keep) {
  const uint64_t size = fs::file_size(path);
  void* fresh = keep ? mmap(nullptr, size, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                     : nullptr;
  if (fresh == MAP_FAILED) Fail(path, "cannot map memory for it");
  std::vector<char> chunk(keep ? 0 : kChunk);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail(path, "cannot open");
  for (uint64_t done = 0; done < size;) {
    char* into = keep ? static_cast<char*>(fresh) + done : chunk.data();
    const ssize_t n = read(fd, into, std::min<uint64_t>(kChunk, size - done));
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  close(fd);
  if (keep) munmap(fresh, size);
}

std::vector<std::string> FilesUnder(const std::string& dir) {
  std::vector<std::string> files;
  if (!fs::exists(dir)) return files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path().string());
  }
  return files;
}

uint64_t BytesUnder(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& f : FilesUnder(dir)) total += fs::file_size(f);
  return total;
}

// Drops the file's pages from the page cache (written back first, so that
// they are clean and can go).
void Evict(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

// Pages of the files under `dir` in the page cache, and all their pages.
std::pair<uint64_t, uint64_t> ResidentPages(const std::string& dir) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t resident = 0, total = 0;
  for (const auto& path : FilesUnder(dir)) {
    const uint64_t size = fs::file_size(path);
    if (size == 0) continue;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) continue;
    std::vector<unsigned char> in_core((size + page - 1) / page);
    if (mincore(map, size, in_core.data()) == 0) {
      for (unsigned char c : in_core) resident += c & 1;
      total += in_core.size();
    }
    munmap(map, size);
  }
  return {resident, total};
}

std::string FilesystemOf(const std::string& dir) {
  struct statfs s {};
  if (statfs(dir.c_str(), &s) != 0) return "unknown";
  switch (s.f_type) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs (memory, not a disk)";
    case 0x6969: return "nfs";
    case 0x794c7630: return "overlayfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "fs type 0x%lx", static_cast<long>(s.f_type));
      return buf;
    }
  }
}

int RunRank(flags::Flags& flags) {
  const std::string base = flags.String("dir", "", "the directory to write in");
  const int repeats = flags.Int("repeats", 3, "repeats");
  const models::GPTConfig config = ReadGPTConfig(flags, Gpt85M());
  flags.Finish();
  at::set_num_threads(ThreadsFromLauncher());
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  const int rank = world->rank(), n = world->size();
  const std::string dir = base + "/n" + std::to_string(n);
  const std::string sharded = dir + "/sharded", full = dir + "/full", hf = dir + "/hf";
  const std::string disk_file = dir + "/disk-" + std::to_string(rank) + ".bin";
  const std::string disk_full = dir + "/disk-full.bin";
  if (rank == 0) fs::create_directories(dir);

  torch::manual_seed(1337);
  models::GPTModule module(config, models::GPT2AdamW(3e-3));
  models::GPT model = module.gpt();
  fsdp::FSDPOptions options;
  options.mesh = comm::DeviceMesh::Create(world, {n}, {"dp"});
  for (size_t i = 0; i < model->blocks->size(); ++i) fsdp::fully_shard(model->block(i), options);
  fsdp::fully_shard(model, options);
  auto optimizer = module.configure_optimizers();
  {  // one step, so that AdamW holds its two moments
    auto gen = at::detail::createCPUGenerator(7 + rank);
    at::Tensor tokens = at::randint(config.vocab_size, {1, config.block_size + 1}, gen,
                                    at::TensorOptions().dtype(at::kLong));
    module.training_step({tokens.narrow(1, 0, config.block_size).contiguous(),
                          tokens.narrow(1, 1, config.block_size).contiguous()},
                         0)
        .backward();
    optimizer->step();
  }

  // The slowest rank's time of `work`, every rank starting after a barrier.
  auto timed = [&](const std::function<void()>& work) {
    world->group()->barrier().wait();
    const auto start = Clock::now();
    work();
    at::Tensor s = at::full({1}, std::chrono::duration<double>(Clock::now() - start).count(),
                            at::kDouble);
    world->group()->all_reduce(s, comm::ReduceOp::kMax).wait();
    return s.item<double>();
  };
  // Every rank evicts every file; then rank 0 measures what is left.
  double resident_max = 0;
  auto evict = [&] {
    world->group()->barrier().wait();
    for (const auto& f : FilesUnder(dir)) Evict(f);
    world->group()->barrier().wait();
    if (rank == 0) {
      const auto [resident, total] = ResidentPages(dir);
      if (total > 0) resident_max = std::max(resident_max, double(resident) / total);
    }
  };
  const std::map<std::string, std::string> progress = {{"step", "1"}};
  auto save_sharded = [&] {
    checkpoint::SaveShardedCheckpoint(sharded, *model, optimizer.get(), *world, progress);
  };
  auto save_full = [&] {
    checkpoint::SaveFullCheckpoint(full, *model, optimizer.get(), *world, progress);
  };
  // Hugging Face's layout (model.safetensors, the parameters only), through
  // the path a Llama's save_hf_checkpoint takes: rank 0 gathers and streams.
  auto save_hf = [&] {
    checkpoint::SaveHfWeights(hf, *model, "{\"model_type\": \"gpt\"}\n",
                              checkpoint::HfSaveOptions{}, *world);
  };

  // A first save of each kind gives the sizes the disk files take.
  save_sharded();
  save_full();
  save_hf();
  const std::string my_file = sharded + "/rank" + std::to_string(rank) + "-of-" +
                              std::to_string(n) + ".safetensors";
  const uint64_t my_bytes = fs::file_size(my_file);
  const uint64_t sharded_bytes = BytesUnder(sharded), full_bytes = BytesUnder(full),
                 hf_bytes = BytesUnder(hf);

  for (int r = 0; r < repeats; ++r) {
    WriteResult("disk_write_s", timed([&] { WriteDiskFile(disk_file, my_bytes); }));
    WriteResult("sharded_save_s", timed(save_sharded));
    evict();
    WriteResult("disk_read_s", timed([&] { ReadDiskFile(disk_file, false); }));
    evict();
    WriteResult("disk_read_keep_s", timed([&] { ReadDiskFile(disk_file, true); }));
    evict();
    WriteResult("sharded_load_s", timed([&] {
                  checkpoint::LoadShardedCheckpoint(sharded, *model, optimizer.get(), *world);
                }));
    checkpoint::PendingWrite write;
    WriteResult("stall_s", timed([&] {
                  write = checkpoint::StageShardedCheckpoint(sharded, *model, optimizer.get(),
                                                             *world, progress);
                }));
    write();
    world->group()->barrier().wait();

    WriteResult("disk_write_one_s", timed([&] {
                  if (rank == 0) WriteDiskFile(disk_full, full_bytes);
                }));
    WriteResult("full_save_s", timed(save_full));
    evict();
    WriteResult("disk_read_one_s", timed([&] {
                  if (rank == 0) ReadDiskFile(disk_full, false);
                }));
    evict();
    WriteResult("disk_read_one_keep_s", timed([&] {
                  if (rank == 0) ReadDiskFile(disk_full, true);
                }));
    evict();
    WriteResult("full_load_s", timed([&] {
                  checkpoint::LoadFullCheckpoint(full, *model, optimizer.get(), *world);
                }));
    WriteResult("hf_save_s", timed(save_hf));
    evict();
    WriteResult("hf_load_s", timed([&] { checkpoint::LoadHfWeights(hf, *model, *world); }));
  }
  world->group()->barrier().wait();
  if (rank == 0) {
    WriteResult("sharded_bytes", double(sharded_bytes));
    WriteResult("disk_bytes_per_rank", double(my_bytes));
    WriteResult("full_bytes", double(full_bytes));
    WriteResult("hf_bytes", double(hf_bytes));
    WriteResult("resident_before_reads", resident_max);
    WriteResult("params", double(config.NumParams()));
    fs::remove_all(dir);
  }
  return 0;
}

// The checksum's speed on one core: CRC-32 of 256 MiB of random bytes, best
// of 3, in GB/s.
double ChecksumGBps() {
  at::Tensor bytes = at::randint(256, {256 << 20}, at::TensorOptions().dtype(at::kByte));
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    volatile uint32_t crc = checkpoint::Crc32(bytes.data_ptr(), bytes.numel());
    (void)crc;
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return bytes.numel() / best / 1e9;
}

int RunParent(flags::Flags& flags, const std::string& self) {
  const std::string dir_flag = flags.String(
      "dir", "", "directory to write in (default: a fresh one under $TMPDIR or /tmp)");
  const std::vector<int64_t> nprocs = flags.IntList("nprocs", {1, 2, 4}, "rank counts");
  const int repeats = flags.Int("repeats", 3, "repeats per rank count (medians printed)");
  const models::GPTConfig config = ReadGPTConfig(flags, Gpt85M());
  const std::string svg = flags.String(
      "svg", "", "also write the ratios to the disk as an SVG bar chart to this file");
  flags.Finish();
  std::string dir = dir_flag;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/fsdp2-ckpt-bench-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) Fail(pattern, "cannot create");
    dir = pattern;
  } else {
    fs::create_directories(dir);
  }
  std::printf("checkpoint bench: %s with AdamW state, fp32, FULL_SHARD; %d repeats, "
              "medians; %d cores; load %s\n",
              config.ToString().c_str(), repeats, Cores(), LoadAverage().c_str());
  std::printf("directory %s (%s); page cache evicted before every read "
              "(fdatasync + posix_fadvise DONTNEED)\n",
              dir.c_str(), FilesystemOf(dir).c_str());
  at::set_num_threads(1);
  std::printf("checksum (CRC-32, one core): %.2f GB/s\n\n", ChecksumGBps());
  std::printf("%-3s %-8s %6s | %7s %7s %5s | %7s %7s %5s %7s %5s | %6s\n", "", "", "",
              "save", "disk", "", "load", "disk", "", "disk to", "", "stall");
  std::printf("%-3s %-8s %6s | %7s %7s %5s | %7s %7s %5s %7s %5s | %6s\n", "N", "format", "MB",
              "MB/s", "write", "ratio", "MB/s", "read", "ratio", "memory", "ratio", "ms");
  std::fflush(stdout);
  auto args = GPTConfigArgs(config);
  args.insert(args.begin(), {"--dir", dir, "--repeats", std::to_string(repeats)});
  double resident = 0;
  std::vector<ChartBar> bars;  // each format's save and load against the disk
  for (int64_t n : nprocs) {
    const Results r =
        RunConfiguration(self, static_cast<int>(n), std::max(1, Cores() / int(n)), args);
    resident = std::max(resident, Value(r, "resident_before_reads"));
    // MB/s of `bytes` in the median time of `key`.
    auto rate = [&](double bytes, const std::string& key) {
      return bytes / 1e6 / Median(Values(r, key));
    };
    auto line = [&](const char* format, double bytes, const std::string& save,
                    const std::string& load, const std::string& disk, double disk_bytes,
                    double stall) {
      const double save_bw = rate(bytes, save), load_bw = rate(bytes, load);
      const double write_bw = rate(disk_bytes, "disk_write" + disk + "_s");
      const double read_bw = rate(disk_bytes, "disk_read" + disk + "_s");
      const double keep_bw = rate(disk_bytes, "disk_read" + disk + "_keep_s");
      std::printf("%-3lld %-8s %6.0f | %7.0f %7.0f %5.2f | %7.0f %7.0f %5.2f %7.0f %5.2f | %6s\n",
                  (long long)n, format, bytes / 1e6, save_bw, write_bw, save_bw / write_bw,
                  load_bw, read_bw, load_bw / read_bw, keep_bw, load_bw / keep_bw,
                  stall < 0 ? "" : std::to_string(int(stall * 1e3 + 0.5)).c_str());
      std::fflush(stdout);
      const std::string group = "N = " + std::to_string(n);
      bars.push_back({group, std::string(format) + " save / disk write", save_bw / write_bw});
      bars.push_back({group, std::string(format) + " load / disk read", load_bw / read_bw});
    };
    line("sharded", Value(r, "sharded_bytes"), "sharded_save_s", "sharded_load_s", "",
         Value(r, "disk_bytes_per_rank") * n, Median(Values(r, "stall_s")));
    line("full", Value(r, "full_bytes"), "full_save_s", "full_load_s", "_one",
         Value(r, "full_bytes"), -1);
    line("hf", Value(r, "hf_bytes"), "hf_save_s", "hf_load_s", "_one", Value(r, "full_bytes"),
         -1);
  }
  std::printf(
      "\ndisk: plain files of the same sizes, by as many writers and readers as the format\n"
      "has (sharded: N; full: rank 0 alone): 8 MiB writes + fsync; 8 MiB reads into one\n"
      "buffer (read: the disk's speed, as dd gives it) and into fresh memory of the file's\n"
      "size (to memory: what any loader pays, the kernel faulting in and zeroing each page\n"
      "before the bytes land). hf: the parameters alone in Hugging Face's layout, saved\n"
      "as full is (rank 0 gathers and writes) and loaded by every rank reading its rows\n"
      "of the one file; compared with the one-writer and one-reader figures.\n"
      "stall: the training thread's part of a background sharded save. Largest share of the files' pages still cached before a read: %.1f%%\n",
      resident * 100);
  if (!svg.empty()) {
    char caption[512];
    std::snprintf(caption, sizeof(caption),
                  "bench/checkpoint: a %.1fM-parameter GPT + AdamW; %d cores; %d repeats, "
                  "medians; %s (%s); bars: each format's MB/s over the disk's own write "
                  "(saves) or one-buffer read (loads) with as many writers or readers",
                  config.NumParams() / 1e6, Cores(), repeats, dir.c_str(),
                  FilesystemOf(dir).c_str());
    WriteChart(svg, RatioChartSvg("checkpoint MB/s against the disk's own, same writers "
                                  "and readers (1 = disk speed)",
                                  caption, bars));
    std::printf("chart: %s\n", svg.c_str());
  }
  if (dir_flag.empty()) fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace fsdp2

int main(int argc, char** argv) {
  using namespace fsdp2;
  try {
    flags::Flags flags(argc, argv, bench::kUsage);
    if (!launch::IsRankProcess()) return bench::RunParent(flags, argv[0]);
    return bench::RunRank(flags);
  } catch (const std::exception& e) {
    std::cerr << "checkpoint bench: " << e.what() << "\n";
    return 1;
  }
}
