// BufferPool without ranks: a freed buffer is handed out again for the next
// request of its size, small requests bypass it, the largest idle one can
// be lent, and release() frees what it keeps.
#include "core/fsdp/internal/buffer_pool.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/fsdp/internal/storage.h"

namespace fsdp2 {
namespace fsdp {
namespace internal {
namespace {

constexpr size_t kBig = 3 << 20;

TEST(BufferPool, AFreedBufferServesTheNextRequestOfItsSize) {
  BufferPool& pool = BufferPool::Get();
  pool.release();
  const auto before = pool.stats();
  void* first = nullptr;
  {
    at::DataPtr p = pool.allocate(kBig);
    first = p.get();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    EXPECT_EQ(pool.stats().in_use_bytes - before.in_use_bytes, int64_t{kBig});
  }
  EXPECT_EQ(pool.stats().kept_bytes, int64_t{kBig});
  {
    at::DataPtr again = pool.allocate(kBig);
    EXPECT_EQ(again.get(), first);
    at::DataPtr other = pool.allocate(kBig + 64);  // another size: a new one
    EXPECT_NE(other.get(), first);
  }
  const auto after = pool.stats();
  EXPECT_EQ(after.allocations - before.allocations, 2);
  EXPECT_EQ(after.reuses - before.reuses, 1);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  pool.release();
  EXPECT_EQ(pool.stats().kept_bytes, 0);
}

TEST(BufferPool, SmallRequestsUseTheDefaultAllocator) {
  BufferPool& pool = BufferPool::Get();
  const auto before = pool.stats();
  { at::DataPtr p = pool.allocate(BufferPool::kMinPooledBytes - 1); }
  const auto after = pool.stats();
  EXPECT_EQ(after.allocations, before.allocations);
  EXPECT_EQ(after.kept_bytes, before.kept_bytes);
}

// lend_largest_idle hands out the largest kept buffer, which comes back
// when freed; with none kept it hands out nothing.
TEST(BufferPool, LendsTheLargestIdleBuffer) {
  BufferPool& pool = BufferPool::Get();
  pool.release();
  size_t nbytes = 1;
  EXPECT_FALSE(pool.lend_largest_idle(&nbytes));
  EXPECT_EQ(nbytes, 0u);
  void* large = nullptr;
  {
    at::DataPtr a = pool.allocate(kBig);
    at::DataPtr b = pool.allocate(2 * kBig);
    large = b.get();
  }
  {
    at::DataPtr lent = pool.lend_largest_idle(&nbytes);
    EXPECT_EQ(lent.get(), large);
    EXPECT_EQ(nbytes, 2 * kBig);
    EXPECT_EQ(pool.stats().kept_bytes, int64_t{kBig});
    EXPECT_EQ(pool.stats().in_use_bytes, int64_t{2 * kBig});
  }
  EXPECT_EQ(pool.stats().kept_bytes, int64_t{3 * kBig});
  pool.release();
}

// The unsharded buffer's cycle: its storage freed at reshard and allocated
// again at unshard comes back as the same memory.
TEST(BufferPool, ATensorsStorageCycleReusesItsBuffer) {
  BufferPool& pool = BufferPool::Get();
  pool.release();
  at::Tensor t = pool.empty({static_cast<int64_t>(kBig / 4)}, at::kFloat);
  void* first = t.data_ptr();
  t.fill_(1.0f);
  FreeStorage(t);
  EXPECT_EQ(pool.stats().kept_bytes, int64_t{kBig});
  ReallocStorage(t, kBig);
  EXPECT_EQ(t.data_ptr(), first);
  t.fill_(2.0f);
  EXPECT_EQ(t.sum().item<double>(), 2.0 * kBig / 4);
  t = at::Tensor();
  pool.release();
}

}  // namespace
}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2
