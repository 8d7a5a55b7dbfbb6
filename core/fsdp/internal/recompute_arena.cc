#include "core/fsdp/internal/recompute_arena.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/fsdp/internal/buffer_pool.h"

namespace fsdp2 {
namespace fsdp {
namespace internal {

// One lent buffer: its pieces in use and its free stretches, by offset.
struct RecomputeArena::Buffer {
  at::DataPtr backing;  // returns to the pool when this is destroyed
  char* base = nullptr;
  size_t size = 0;
  std::map<size_t, size_t> used, free;  // offset -> bytes
  size_t live = 0;
  bool closed = false;  // its scope has ended

  // First fit, 64-byte aligned; nullptr if no stretch is large enough.
  void* take(size_t nbytes) {
    const size_t need = (nbytes + 63) & ~size_t{63};
    for (auto it = free.begin(); it != free.end(); ++it) {
      if (it->second < need) continue;
      const size_t offset = it->first, rest = it->second - need;
      free.erase(it);
      if (rest > 0) free.emplace(offset + need, rest);
      used.emplace(offset, need);
      live += need;
      return base + offset;
    }
    return nullptr;
  }

  // Gives a piece back, joining it with free neighbours.
  void give(void* p) {
    const size_t offset = static_cast<size_t>(static_cast<char*>(p) - base);
    auto piece = used.find(offset);
    if (piece == used.end()) return;  // not ours: cannot happen
    size_t start = offset, bytes = piece->second;
    live -= bytes;
    used.erase(piece);
    auto next = free.lower_bound(start);
    if (next != free.end() && start + bytes == next->first) {
      bytes += next->second;
      next = free.erase(next);
    }
    if (next != free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        bytes += prev->second;
        free.erase(prev);
      }
    }
    free.emplace(start, bytes);
  }

  bool contains(const void* p) const {
    return p >= base && p < base + size;
  }
};

namespace {

using Buffer = RecomputeArena::Buffer;

// The lent buffers with pieces in use or a scope still open. One lock for
// all: frees come from any thread, and there are one or two buffers.
std::mutex g_mu;
// How many there are, read without the lock: a raw free of memory that no
// lent buffer holds (the common case, and all of it when none is lent)
// skips the lock.
std::atomic<size_t> g_lent_count{0};
std::vector<std::shared_ptr<Buffer>>& Lent() {
  static auto* lent = new std::vector<std::shared_ptr<Buffer>>();  // never destroyed
  return *lent;
}

// This thread's buffer while a Scope is active on it.
thread_local Buffer* t_buffer = nullptr;

// Removes `buffer` from the lent ones once its scope has ended and nothing
// lives in it; the caller destroys it (returning it to the pool) outside the
// lock.
std::shared_ptr<Buffer> RetireIfDone(Buffer* buffer) {
  if (!buffer->closed || buffer->live != 0) return nullptr;
  auto& lent = Lent();
  for (auto it = lent.begin(); it != lent.end(); ++it) {
    if (it->get() != buffer) continue;
    std::shared_ptr<Buffer> done = std::move(*it);
    lent.erase(it);
    g_lent_count.store(lent.size(), std::memory_order_release);
    return done;
  }
  return nullptr;
}

// Frees a piece if one of the lent buffers holds `p`; false otherwise.
bool FreeIfLent(void* p) {
  // A piece of a lent buffer keeps it in the list until freed here.
  if (g_lent_count.load(std::memory_order_acquire) == 0) return false;
  std::shared_ptr<Buffer> done;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Buffer* holder = nullptr;
    for (const auto& b : Lent()) {
      if (b->contains(p)) holder = b.get();
    }
    if (holder == nullptr) return false;
    holder->give(p);
    done = RetireIfDone(holder);
  }
  return true;  // `done`, if any, goes back to the pool here
}

void FreePiece(void* p) { FreeIfLent(p); }

// LibTorch's CPU allocator, wrapped: pieces of this thread's lent buffer
// for large requests inside a Scope, the wrapped allocator for the rest.
class WrappingAllocator final : public c10::Allocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    Buffer* buffer = t_buffer;
    if (buffer != nullptr && nbytes >= RecomputeArena::kMinBytes) {
      void* p = nullptr;
      {
        std::lock_guard<std::mutex> lock(g_mu);
        p = buffer->take(nbytes);
      }
      if (p != nullptr) return at::DataPtr(p, p, &FreePiece, at::Device(at::kCPU));
    }
    return wrapped_->allocate(nbytes);
  }

  at::DeleterFnPtr raw_deleter() const override { return &RawDelete; }

  // Pieces and the wrapped allocator's buffers are both plain host memory.
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Installs the wrapper once; false if LibTorch's CPU allocator is not it
  // (another one was set with a higher priority).
  static bool Install() {
    static WrappingAllocator* wrapper = [] {
      auto* w = new WrappingAllocator();  // never destroyed: tensors outlive main
      w->wrapped_ = c10::GetCPUAllocator();
      g_wrapped_raw = w->wrapped_->raw_deleter();
      c10::SetCPUAllocator(w, /*priority=*/0);
      return w;
    }();
    return c10::GetCPUAllocator() == wrapper;
  }

 private:
  static void RawDelete(void* p) {
    if (!FreeIfLent(p) && g_wrapped_raw != nullptr) g_wrapped_raw(p);
  }

  c10::Allocator* wrapped_ = nullptr;
  static at::DeleterFnPtr g_wrapped_raw;
};

at::DeleterFnPtr WrappingAllocator::g_wrapped_raw = nullptr;

}  // namespace

RecomputeArena::Scope::Scope() : previous_(t_buffer) {
  if (!Install()) return;
  size_t nbytes = 0;
  at::DataPtr backing = BufferPool::Get().lend_largest_idle(&nbytes);
  if (!backing) return;
  auto buffer = std::make_shared<Buffer>();
  buffer->base = static_cast<char*>(backing.get());
  buffer->size = nbytes;
  buffer->backing = std::move(backing);
  buffer->free.emplace(0, nbytes);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Lent().push_back(buffer);
    g_lent_count.store(Lent().size(), std::memory_order_release);
  }
  buffer_ = std::move(buffer);
  t_buffer = buffer_.get();
}

RecomputeArena::Scope::~Scope() {
  if (!buffer_) return;
  t_buffer = previous_;
  std::shared_ptr<Buffer> done;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    buffer_->closed = true;
    done = RetireIfDone(buffer_.get());
  }
  buffer_.reset();  // with `done`, the last owner when nothing lives in it
}

RecomputeArena::Outside::Outside() : previous_(t_buffer) { t_buffer = nullptr; }
RecomputeArena::Outside::~Outside() { t_buffer = previous_; }

bool RecomputeArena::Install() { return WrappingAllocator::Install(); }

bool RecomputeArena::Holds(const at::Tensor& t) {
  return t.defined() && t.has_storage() &&
         t.storage().data_ptr().get_deleter() == &FreePiece;
}

size_t RecomputeArena::LiveBytes() {
  std::lock_guard<std::mutex> lock(g_mu);
  size_t live = 0;
  for (const auto& b : Lent()) live += b->live;
  return live;
}

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2
