// RecomputeArena without ranks: inside a scope, this thread's large CPU
// allocations are placed in a buffer lent by the engine's pool (first fit,
// freed pieces joined again), small ones, other threads', those under an
// Outside guard and what does not fit go to the allocator as before, and the buffer goes back to the pool
// only when the scope has ended and its last piece is freed.
#include "core/fsdp/internal/recompute_arena.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <thread>

#include "core/fsdp/internal/buffer_pool.h"

namespace fsdp2 {
namespace fsdp {
namespace internal {
namespace {

constexpr int64_t kBufferBytes = 4 << 20;
constexpr int64_t kFloats = 256 << 10;  // 1 MiB of floats

// Leaves exactly one idle buffer of kBufferBytes in the pool.
void OneIdleBuffer() {
  BufferPool& pool = BufferPool::Get();
  pool.release();
  at::DataPtr p = pool.allocate(kBufferBytes);
}

TEST(RecomputeArena, LargeAllocationsGoIntoTheLentBuffer) {
  OneIdleBuffer();
  RecomputeArena::Scope scope;
  ASSERT_TRUE(scope.active());
  EXPECT_EQ(BufferPool::Get().stats().kept_bytes, 0);
  at::Tensor large = at::ones({kFloats}, at::kFloat);
  at::Tensor small = at::ones({16}, at::kFloat);
  EXPECT_TRUE(RecomputeArena::Holds(large));
  EXPECT_FALSE(RecomputeArena::Holds(small));
  EXPECT_EQ(RecomputeArena::LiveBytes(), static_cast<size_t>(kFloats * 4));
  EXPECT_FLOAT_EQ(large.sum().item<float>(), static_cast<float>(kFloats));
  // Another thread allocates as before.
  bool other_thread_inside = true;
  std::thread([&] {
    other_thread_inside = RecomputeArena::Holds(at::ones({kFloats}, at::kFloat));
  }).join();
  EXPECT_FALSE(other_thread_inside);
}

TEST(RecomputeArena, WhatDoesNotFitGoesElsewhere) {
  OneIdleBuffer();
  RecomputeArena::Scope scope;
  ASSERT_TRUE(scope.active());
  std::vector<at::Tensor> pieces;
  for (int i = 0; i < 4; ++i) pieces.push_back(at::empty({kFloats}, at::kFloat));
  for (const auto& p : pieces) EXPECT_TRUE(RecomputeArena::Holds(p));
  at::Tensor fifth = at::empty({kFloats}, at::kFloat);  // the buffer is full
  EXPECT_FALSE(RecomputeArena::Holds(fifth));
}

TEST(RecomputeArena, FreedPiecesJoinAgain) {
  OneIdleBuffer();
  RecomputeArena::Scope scope;
  ASSERT_TRUE(scope.active());
  {
    at::Tensor a = at::empty({kFloats}, at::kFloat);
    at::Tensor b = at::empty({kFloats}, at::kFloat);
    at::Tensor c = at::empty({kFloats}, at::kFloat);
    at::Tensor d = at::empty({kFloats}, at::kFloat);
    b.reset();
    c.reset();  // joins b
    at::Tensor bc = at::empty({2 * kFloats}, at::kFloat);
    EXPECT_TRUE(RecomputeArena::Holds(bc));
  }  // everything freed: one stretch again
  EXPECT_EQ(RecomputeArena::LiveBytes(), 0u);
  at::Tensor whole = at::empty({kBufferBytes / 4}, at::kFloat);
  EXPECT_TRUE(RecomputeArena::Holds(whole));
}

TEST(RecomputeArena, TheBufferReturnsWhenTheScopeEndedAndItsLastPieceIsFreed) {
  OneIdleBuffer();
  at::Tensor outlives;
  {
    RecomputeArena::Scope scope;
    ASSERT_TRUE(scope.active());
    outlives = at::ones({kFloats}, at::kFloat);
  }
  EXPECT_TRUE(RecomputeArena::Holds(outlives));
  EXPECT_EQ(BufferPool::Get().stats().kept_bytes, 0);  // still lent
  at::Tensor after = at::ones({kFloats}, at::kFloat);  // the scope has ended
  EXPECT_FALSE(RecomputeArena::Holds(after));
  outlives.reset();
  EXPECT_EQ(RecomputeArena::LiveBytes(), 0u);
  EXPECT_EQ(BufferPool::Get().stats().kept_bytes, kBufferBytes);
  BufferPool::Get().release();
}

TEST(RecomputeArena, OutsideSuspendsTheScope) {
  OneIdleBuffer();
  RecomputeArena::Scope scope;
  ASSERT_TRUE(scope.active());
  {
    RecomputeArena::Outside outside;
    EXPECT_FALSE(RecomputeArena::Holds(at::ones({kFloats}, at::kFloat)));
  }
  EXPECT_TRUE(RecomputeArena::Holds(at::ones({kFloats}, at::kFloat)));
}

TEST(RecomputeArena, NoIdleBufferNoArena) {
  BufferPool::Get().release();
  RecomputeArena::Scope scope;
  EXPECT_FALSE(scope.active());
  EXPECT_FALSE(RecomputeArena::Holds(at::ones({kFloats}, at::kFloat)));
}

// raw_allocate / raw_deallocate through LibTorch's CPU allocator (which
// the arena wraps) work inside a scope and outside it.
TEST(RecomputeArena, RawAllocationsWork) {
  OneIdleBuffer();
  c10::Allocator* cpu = c10::GetCPUAllocator();
  {
    RecomputeArena::Scope scope;
    ASSERT_TRUE(scope.active());
    void* p = cpu->raw_allocate(kFloats * 4);
    EXPECT_EQ(RecomputeArena::LiveBytes(), static_cast<size_t>(kFloats * 4));
    cpu->raw_deallocate(p);
    EXPECT_EQ(RecomputeArena::LiveBytes(), 0u);
  }
  void* q = cpu->raw_allocate(kFloats * 4);
  cpu->raw_deallocate(q);
  BufferPool::Get().release();
}

}  // namespace
}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2
