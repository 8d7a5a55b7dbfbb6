#include "core/comm/internal/shm_transport.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace fsdp2 {
namespace comm {
namespace internal {
namespace {

// Header: one cache line per rank holding its sequence word and pid.
constexpr size_t kLine = 64;
// Spins on a sequence word before sleeping on its futex.
constexpr int kSpins = 128;
// Sleep slice: how often a waiting rank checks the deadline and its peer.
constexpr auto kSlice = std::chrono::milliseconds(50);

struct RankLine {
  std::atomic<uint32_t> seq;
  int32_t pid;
};
static_assert(sizeof(RankLine) <= kLine, "header line");
static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "futex words must be lock-free atomics");

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
std::string String(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

// This host, as precisely as processes sharing /dev/shm need: the host name
// and the kernel's boot id.
std::string HostIdentity() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return std::string(host) + "/" + boot;
}

std::string Errno(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value,
           const struct timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value,
                 timeout, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Whether process `pid` has exited: gone, or a zombie its parent has not
// reaped yet.
bool ProcessExited(int32_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() &&
         line[paren + 2] == 'Z';
}

bool Is16BitFloat(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16;
}

}  // namespace

std::unique_ptr<ShmTransport> ShmTransport::Connect(
    ::c10d::Store& store, int rank, int world, size_t slot_bytes,
    std::chrono::milliseconds timeout) {
  if (world < 2) return nullptr;
  const char* env = std::getenv("FSDP2_SHM");
  const bool enabled = env == nullptr || std::string(env) != "0";
  // Every rank decides alike: shared memory only if all are on this host
  // and none has turned it off.
  store.set("fsdp2_shm/host/" + std::to_string(rank),
            Bytes(HostIdentity() + (enabled ? "/on" : "/off")));
  bool usable = enabled;
  const std::string mine = HostIdentity() + "/on";
  for (int k = 0; k < world; ++k) {
    if (String(store.get("fsdp2_shm/host/" + std::to_string(k))) != mine) {
      usable = false;
    }
  }
  if (!usable) return nullptr;

  const size_t header = RoundUp(world * kLine, 4096);
  const size_t total = header + world * slot_bytes;
  std::string name, error;
  int fd = -1;
  if (rank == 0) {
    std::random_device random;
    std::ostringstream s;
    s << "/fsdp2-" << getpid() << "-" << std::hex << random() << random();
    name = s.str();
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      error = Errno("shm_open " + name);
    } else if (int rc = posix_fallocate(fd, 0, total); rc != 0) {
      // Reserve the pages now: a /dev/shm too small for them would
      // otherwise kill us with SIGBUS at the first touch.
      errno = rc;
      error = Errno("posix_fallocate " + std::to_string(total) + " bytes");
    }
    store.set("fsdp2_shm/name", Bytes(error.empty() ? name : ""));
  } else {
    name = String(store.get("fsdp2_shm/name"));
    if (!name.empty()) {
      fd = shm_open(name.c_str(), O_RDWR, 0600);
      if (fd < 0) error = Errno("shm_open " + name);
    } else {
      error = "rank 0 could not create the segment";
    }
  }
  void* base = MAP_FAILED;
  if (error.empty()) {
    base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) error = Errno("mmap");
  }
  if (fd >= 0) close(fd);
  // Agree: if any rank failed, every rank falls back to the backend.
  store.set("fsdp2_shm/ok/" + std::to_string(rank),
            Bytes(error.empty() ? "1" : "0"));
  bool all_ok = true;
  for (int k = 0; k < world; ++k) {
    all_ok = all_ok && String(store.get("fsdp2_shm/ok/" + std::to_string(k))) == "1";
  }
  if (!all_ok) {
    if (base != MAP_FAILED) munmap(base, total);
    if (rank == 0 && !name.empty()) shm_unlink(name.c_str());
    return nullptr;
  }
  auto* line = reinterpret_cast<RankLine*>(static_cast<uint8_t*>(base) +
                                           rank * kLine);
  line->pid = static_cast<int32_t>(getpid());
  std::unique_ptr<ShmTransport> transport(
      new ShmTransport(rank, world, slot_bytes, base, total, timeout));
  transport->sync();  // everyone has mapped it: the name can go
  if (rank == 0) shm_unlink(name.c_str());
  return transport;
}

ShmTransport::ShmTransport(int rank, int world, size_t slot_bytes, void* base,
                           size_t mapped_bytes,
                           std::chrono::milliseconds timeout)
    : rank_(rank),
      world_(world),
      slot_bytes_(slot_bytes),
      base_(base),
      mapped_bytes_(mapped_bytes),
      timeout_(timeout) {}

ShmTransport::~ShmTransport() { munmap(base_, mapped_bytes_); }

uint8_t* ShmTransport::slot(int rank) const {
  return static_cast<uint8_t*>(base_) + RoundUp(world_ * kLine, 4096) +
         rank * slot_bytes_;
}

at::Tensor ShmTransport::slot_tensor(int rank, int64_t offset_elems,
                                     int64_t numel,
                                     const at::TensorOptions& options) const {
  const int64_t esize = static_cast<int64_t>(
      c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  return at::from_blob(slot(rank) + offset_elems * esize, {numel},
                       options.device(at::kCPU));
}

void ShmTransport::sync() {
  ++epoch_;
  auto line = [this](int k) {
    return reinterpret_cast<RankLine*>(static_cast<uint8_t*>(base_) + k * kLine);
  };
  RankLine* me = line(rank_);
  me->seq.store(epoch_, std::memory_order_release);
  Futex(&me->seq, FUTEX_WAKE, INT32_MAX, nullptr);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int k = 0; k < world_; ++k) {
    if (k == rank_) continue;
    RankLine* peer = line(k);
    int spins = 0;
    for (;;) {
      const uint32_t seen = peer->seq.load(std::memory_order_acquire);
      if (static_cast<int32_t>(seen - epoch_) >= 0) break;
      if (++spins < kSpins) {
        CpuRelax();
        continue;
      }
      struct timespec slice {
        0, std::chrono::duration_cast<std::chrono::nanoseconds>(kSlice).count()
      };
      if (Futex(&peer->seq, FUTEX_WAIT, seen, &slice) == 0 || errno != ETIMEDOUT) {
        continue;  // woken, or the word had already changed
      }
      if (ProcessExited(peer->pid)) {
        throw std::runtime_error("rank " + std::to_string(k) + " (pid " +
                                 std::to_string(peer->pid) +
                                 ") exited during a shared-memory collective");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error(
            "timed out after " + std::to_string(timeout_.count()) +
            " ms waiting for rank " + std::to_string(k) +
            " in a shared-memory collective");
      }
    }
  }
}

void ShmTransport::barrier() { sync(); }

void ShmTransport::reduce_slots(int64_t offset_elems, ReduceOp op,
                                const at::Tensor& out) const {
  const int64_t numel = out.numel();
  const auto options = out.options();
  const bool upcast = Is16BitFloat(out.scalar_type());
  at::Tensor acc = upcast ? at::empty({numel}, options.dtype(at::kFloat)) : out;
  acc.copy_(slot_tensor(0, offset_elems, numel, options));
  for (int k = 1; k < world_; ++k) {
    at::Tensor theirs = slot_tensor(k, offset_elems, numel, options);
    if (op == ReduceOp::kSum) {
      acc.add_(theirs);
    } else {
      at::maximum_out(acc, acc, theirs.to(acc.scalar_type()));
    }
  }
  if (upcast) out.copy_(acc);
}

void ShmTransport::all_gather_pieces(
    const at::Tensor& buffer_in, const std::vector<ProcessGroup::Piece>& pieces) {
  const at::Tensor buffer = buffer_in.view(-1);
  const int64_t esize = buffer.element_size();
  const int64_t seg = static_cast<int64_t>(slot_bytes_) / esize;
  int64_t per_rank = 0;
  for (const auto& p : pieces) per_rank += p.numel;
  const auto options = buffer.options();
  // Calls fn(rank r's part of piece p from element `from`, slot element
  // `at`, `len` elements) for the parts of [start, start + len) of the
  // pieces laid end to end.
  auto fragments = [&](int64_t start, int64_t len, auto&& fn) {
    int64_t virt = 0;
    for (const auto& p : pieces) {
      const int64_t lo = std::max(start, virt);
      const int64_t hi = std::min(start + len, virt + p.numel);
      if (lo < hi) fn(p, lo - virt, lo - start, hi - lo);
      virt += p.numel;
    }
  };
  for (int64_t start = 0; start < per_rank; start += seg) {
    const int64_t len = std::min(seg, per_rank - start);
    fragments(start, len, [&](const ProcessGroup::Piece& p, int64_t from,
                              int64_t at, int64_t n) {
      slot_tensor(rank_, at, n, options)
          .copy_(buffer.narrow(0, world_ * p.offset + rank_ * p.numel + from, n));
    });
    sync();
    for (int k = 0; k < world_; ++k) {
      if (k == rank_) continue;
      fragments(start, len, [&](const ProcessGroup::Piece& p, int64_t from,
                                int64_t at, int64_t n) {
        buffer.narrow(0, world_ * p.offset + k * p.numel + from, n)
            .copy_(slot_tensor(k, at, n, options));
      });
    }
    sync();
  }
}

void ShmTransport::reduce_scatter(const at::Tensor& output_in,
                                  const at::Tensor& input_in) {
  const at::Tensor output = output_in.view(-1), input = input_in.view(-1);
  const int64_t n = output.numel();
  const int64_t seg =
      static_cast<int64_t>(slot_bytes_) / input.element_size() / world_;
  TORCH_CHECK(seg > 0, "shared-memory slot too small");
  const auto options = input.options();
  for (int64_t start = 0; start < n; start += seg) {
    const int64_t len = std::min(seg, n - start);
    for (int k = 0; k < world_; ++k) {
      slot_tensor(rank_, k * len, len, options)
          .copy_(input.narrow(0, k * n + start, len));
    }
    sync();
    reduce_slots(rank_ * len, ReduceOp::kSum, output.narrow(0, start, len));
    sync();
  }
}

void ShmTransport::all_reduce(const at::Tensor& tensor_in, ReduceOp op) {
  const at::Tensor tensor = tensor_in.view(-1);
  const int64_t n = tensor.numel();
  const int64_t seg = static_cast<int64_t>(slot_bytes_) / tensor.element_size();
  const auto options = tensor.options();
  for (int64_t start = 0; start < n; start += seg) {
    const int64_t len = std::min(seg, n - start);
    // Rank k reduces part k of the segment for everyone.
    const int64_t part = (len + world_ - 1) / world_;
    auto part_range = [&](int k) {
      const int64_t lo = std::min(len, k * part);
      return std::make_pair(lo, std::min(len, lo + part) - lo);
    };
    slot_tensor(rank_, 0, len, options).copy_(tensor.narrow(0, start, len));
    sync();
    const auto [lo, count] = part_range(rank_);
    if (count > 0) {
      at::Tensor reduced = at::empty({count}, options);
      reduce_slots(lo, op, reduced);
      // Only this rank reads this part of its own slot, and it is done.
      slot_tensor(rank_, lo, count, options).copy_(reduced);
    }
    sync();
    for (int k = 0; k < world_; ++k) {
      const auto [klo, kcount] = part_range(k);
      if (kcount > 0) {
        tensor.narrow(0, start + klo, kcount)
            .copy_(slot_tensor(k, klo, kcount, options));
      }
    }
    sync();
  }
}

void ShmTransport::broadcast(const at::Tensor& tensor_in, int root) {
  const at::Tensor tensor = tensor_in.view(-1);
  const int64_t n = tensor.numel();
  const int64_t seg = static_cast<int64_t>(slot_bytes_) / tensor.element_size();
  const auto options = tensor.options();
  for (int64_t start = 0; start < n; start += seg) {
    const int64_t len = std::min(seg, n - start);
    if (rank_ == root) {
      slot_tensor(rank_, 0, len, options).copy_(tensor.narrow(0, start, len));
    }
    sync();
    if (rank_ != root) {
      tensor.narrow(0, start, len).copy_(slot_tensor(root, 0, len, options));
    }
    sync();
  }
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
