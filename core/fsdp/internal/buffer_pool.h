// fsdp2/core/fsdp/internal/buffer_pool.h
//
// BufferPool: where the engine's unit-sized host buffers come from — the
// unsharded parameters of a unit and its gradient reduction input (the
// reduction's output is the input's own row).
// Every step asks for the same sizes again (one per unit shape), so a freed
// buffer is kept and handed out again for the next request of exactly its
// size: steady-state training allocates none of them anew, and their pages
// stay mapped instead of being faulted in afresh each step.
//
// What the pool keeps is bounded by what the engine used at once: a buffer
// comes back to the pool only when the tensor holding it is freed, and only
// a request of its size takes it out again. release() returns the kept
// buffers to the system (fsdp::release_buffer_pool()). A checkpointed
// unit's backward borrows an idle buffer for its recomputed activations
// and gradients (lend_largest_idle, RecomputeArena), so that memory serves
// them without going through the process allocator, and comes back whole.
//
// Requests under kMinPooledBytes and tensors on other devices use the
// default allocators. Thread-safe: buffers are freed on communication
// threads too.
#ifndef FSDP2_CORE_FSDP_INTERNAL_BUFFER_POOL_H_
#define FSDP2_CORE_FSDP_INTERNAL_BUFFER_POOL_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/fsdp/stats_types.h"

namespace fsdp2 {
namespace fsdp {
namespace internal {

class BufferPool final : public c10::Allocator {
 public:
  static constexpr size_t kMinPooledBytes = size_t{1} << 20;

  // The engine's pool (one per process, never destroyed).
  static BufferPool& Get();

  // c10::Allocator: a 64-byte aligned host buffer of `nbytes`, a kept one of
  // that size if there is one. Throws c10::Error when memory runs out.
  at::DataPtr allocate(size_t nbytes) override;
  at::DeleterFnPtr raw_deleter() const override { return nullptr; }
  // Plain host memory: copies are memcpy.
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // An uninitialised contiguous tensor of `sizes` from the pool (CPU), or
  // from the default allocator (other devices).
  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options);

  // Frees every kept buffer now. Buffers in use are kept again when freed.
  void release();
  // The largest kept buffer, now in use (its size in *nbytes); an empty
  // DataPtr if none is kept. It comes back to the pool when freed.
  at::DataPtr lend_largest_idle(size_t* nbytes);

  BufferPoolStats stats() const;

 private:
  BufferPool() = default;
  static void Return(void* block);

  struct Block;
  mutable std::mutex mu_;
  mutable std::map<size_t, std::vector<Block*>> free_;  // by size
  mutable BufferPoolStats stats_;
};

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_BUFFER_POOL_H_
