// fsdp2/core/fsdp/internal/recompute_arena.h
//
// RecomputeArena: where a checkpointed unit's recomputation puts its
// activations, and then the gradients computed from them: inside an idle
// unit-sized buffer that the engine's pool lends for the unit's backward.
//
// Why: in a checkpointed backward the same memory holds, by turns, the
// reduction buffer of the unit before, this unit's recomputed activations
// and gradients, then the next unit's all-gather (the prefetch). Through
// the process allocator those turns split unit-sized free spans into
// pieces, and a later unit buffer that finds no free span of its size
// grows the heap by a whole unit (measured: 27 MiB on the 85M GPT, in some
// runs and not others). In the lent buffer the activations and gradients
// take its room by turns instead, and when the last of them is freed
// (the unit's post-backward has copied the gradients into its reduction
// buffer) the buffer goes back to the pool whole, for the prefetch.
//
// While a Scope is active on a thread, that thread's CPU allocations of
// kMinBytes and more are placed in the lent buffer (first fit); what does
// not fit, and everything on other threads, goes to the allocator that was
// installed before (tcmalloc, normally). The arena is installed as LibTorch's
// CPU allocator on first use and forwards everything else unchanged.
// Allocations keep data == context, so raw_allocate/raw_deallocate work.
#ifndef FSDP2_CORE_FSDP_INTERNAL_RECOMPUTE_ARENA_H_
#define FSDP2_CORE_FSDP_INTERNAL_RECOMPUTE_ARENA_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>

namespace fsdp2 {
namespace fsdp {
namespace internal {

class RecomputeArena {
 public:
  static constexpr size_t kMinBytes = size_t{64} << 10;

  struct Buffer;  // one lent buffer and its pieces (recompute_arena.cc)

  // Lends the pool's largest idle buffer to this thread's allocations until
  // destroyed (none if the pool keeps no idle buffer, or LibTorch's CPU
  // allocator could not be wrapped). The buffer returns to the pool when
  // the scope has ended and the last tensor placed in it is freed.
  class Scope {
   public:
    Scope();
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    bool active() const { return buffer_ != nullptr; }

   private:
    std::shared_ptr<Buffer> buffer_;
    Buffer* previous_;
  };

  // Suspends this thread's scope while it lives: for the engine's own work
  // inside a recomputation (finishing a reduction may allocate a sharded
  // gradient, which must not live in the lent buffer).
  class Outside {
   public:
    Outside();
    ~Outside();
    Outside(const Outside&) = delete;
    Outside& operator=(const Outside&) = delete;

   private:
    Buffer* previous_;
  };

  // Wraps LibTorch's CPU allocator now, if not yet done (checkpoint_module
  // calls it, before training starts, so that the allocator does not change
  // under running threads); false if another allocator with a higher
  // priority is in place, and then no buffer is ever lent.
  static bool Install();

  // Whether `t`'s memory lies in a lent buffer (a tensor that outlives the
  // recomputation, such as the gradient it passes on to the unit before, is
  // copied out so that it does not hold the buffer back from the pool).
  static bool Holds(const at::Tensor& t);

  // Bytes placed in lent buffers and not yet freed, over all of them.
  static size_t LiveBytes();

  RecomputeArena() = delete;
};

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_RECOMPUTE_ARENA_H_
