#include "core/comm/internal/shm_segment.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm/internal/store_bytes.h"

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

// Each sync writes its signature into slot epoch % 2 of the rank's line: a
// peer is at most one sync ahead, so it never overwrites the slot that the
// others are still comparing.
struct SignatureWords {
  std::atomic<uint64_t> epoch;
  std::atomic<uint64_t> kind_dtype;  // kind << 32 | (uint32_t) dtype
  std::atomic<int64_t> numel;
  std::atomic<int64_t> extra;
};
struct RankLine {
  std::atomic<uint32_t> seq;
  int32_t pid;
  SignatureWords signature[2];
};
static_assert(sizeof(RankLine) <= 2 * kLine, "header line");
static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "futex words must be lock-free atomics");

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }
size_t HeaderBytes(int world) { return RoundUp(world * 2 * kLine, 4096); }

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

RankLine* Line(void* base, int rank) {
  return reinterpret_cast<RankLine*>(static_cast<uint8_t*>(base) +
                                     rank * 2 * kLine);
}

uint64_t KindDtype(const CollectiveSignature& s) {
  return (uint64_t{s.kind} << 32) | static_cast<uint32_t>(s.dtype);
}

}  // namespace

std::string CollectiveSignature::ToString() const {
  static const char* const kNames[] = {"barrier", "all-gather", "reduce-scatter",
                                       "all-reduce sum", "all-reduce max",
                                       "broadcast"};
  std::string s = kind <= kBroadcast ? kNames[kind] : "collective " + std::to_string(kind);
  if (kind == kBarrier) return s;
  s += " of " + std::to_string(numel) + " ";
  s += dtype >= 0 ? c10::toString(static_cast<at::ScalarType>(dtype)) : "?";
  s += " elements per rank";
  if (kind == kBroadcast) s += " from rank " + std::to_string(extra);
  return s;
}

std::unique_ptr<ShmSegment> ShmSegment::Create(
    ::c10d::Store& store, int rank, int world, size_t slot_bytes,
    std::chrono::milliseconds timeout) {
  const size_t total = HeaderBytes(world) + world * slot_bytes;
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
  // Agree: if any rank failed, every rank falls back to another transport.
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
  Line(base, rank)->pid = static_cast<int32_t>(getpid());
  std::unique_ptr<ShmSegment> segment(
      new ShmSegment(rank, world, slot_bytes, base, total, timeout));
  segment->sync();  // everyone has mapped it: the name can go
  if (rank == 0) shm_unlink(name.c_str());
  return segment;
}

ShmSegment::ShmSegment(int rank, int world, size_t slot_bytes, void* base,
                       size_t mapped_bytes, std::chrono::milliseconds timeout)
    : rank_(rank),
      world_(world),
      slot_bytes_(slot_bytes),
      base_(base),
      mapped_bytes_(mapped_bytes),
      timeout_(timeout) {}

ShmSegment::~ShmSegment() { munmap(base_, mapped_bytes_); }

at::Tensor ShmSegment::slot(int rank, int64_t offset, int64_t numel,
                            const at::TensorOptions& options) const {
  uint8_t* start = static_cast<uint8_t*>(base_) + HeaderBytes(world_) +
                   rank * slot_bytes_;
  const int64_t esize = static_cast<int64_t>(
      c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  return at::from_blob(start + offset * esize, {numel},
                       options.device(at::kCPU));
}

void ShmSegment::sync(const CollectiveSignature& signature) {
  ++epoch_;
  RankLine* me = Line(base_, rank_);
  SignatureWords& mine = me->signature[epoch_ % 2];
  mine.kind_dtype.store(KindDtype(signature), std::memory_order_relaxed);
  mine.numel.store(signature.numel, std::memory_order_relaxed);
  mine.extra.store(signature.extra, std::memory_order_relaxed);
  mine.epoch.store(epoch_, std::memory_order_relaxed);
  me->seq.store(epoch_, std::memory_order_release);
  Futex(&me->seq, FUTEX_WAKE, INT32_MAX, nullptr);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int k = 0; k < world_; ++k) {
    if (k == rank_) continue;
    RankLine* peer = Line(base_, k);
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
        throw CommunicationError("rank " + std::to_string(k) + " (pid " +
                                 std::to_string(peer->pid) +
                                 ") exited during a shared-memory collective");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throw TimeoutError(
            "timed out after " + std::to_string(timeout_.count()) +
            " ms waiting for rank " + std::to_string(k) +
            " in a shared-memory collective");
      }
    }
  }
  // Every rank has arrived: compare what they arrived for.
  for (int k = 0; k < world_; ++k) {
    if (k == rank_) continue;
    const SignatureWords& theirs = Line(base_, k)->signature[epoch_ % 2];
    CollectiveSignature other;
    const uint64_t kind_dtype = theirs.kind_dtype.load(std::memory_order_relaxed);
    other.kind = static_cast<CollectiveSignature::Kind>(kind_dtype >> 32);
    other.dtype = static_cast<int32_t>(static_cast<uint32_t>(kind_dtype));
    other.numel = theirs.numel.load(std::memory_order_relaxed);
    other.extra = theirs.extra.load(std::memory_order_relaxed);
    const bool same_sync =
        theirs.epoch.load(std::memory_order_relaxed) == epoch_;
    if (!same_sync || !(other == signature)) {
      throw CommunicationError(
          "shared-memory collectives do not match: rank " +
          std::to_string(rank_) + " is in a " + signature.ToString() +
          ", rank " + std::to_string(k) + " in a " +
          (same_sync ? other.ToString() : "different step of a collective") +
          "; every rank of a group must issue the same collectives in the "
          "same order");
    }
  }
}

}  // namespace internal
}  // namespace comm
}  // namespace fsdp2
