// fsdp2/core/strategy/lazy_zero_grad.h
//
// zero_grad() that frees the gradients and still steps as if they had been
// zeroed in place.
//
// Optimizer::zero_grad(/*set_to_none=*/false) keeps every .grad allocated
// and fills it with zeros, so a rank holds all its gradient shards through
// the next forward, where FULL_SHARD's peak is (85M GPT, N = 2: 65 of 1,025
// MiB per rank). PyTorch 2's default (set_to_none=true) frees them instead,
// but then a parameter that gets no gradient in the next step is skipped by
// the optimizer, where a zero gradient would still decay it (AdamW) and move
// its moments: the losses differ from those of in-place zeroing, which
// FSDP2Strategy keeps (PyTorch 1.x's default, and every reference of the
// tests, which say set_to_none=False).
//
// LazyZeroGrad frees them and remembers which it freed. materialize(),
// called right before clipping and the optimizer step, gives each of those
// that got no gradient since a zero one, so every step computes exactly
// what in-place zeroing computes (0 + g is g). Between zero_grad() and the
// next backward, .grad is undefined instead of zero.
#ifndef FSDP2_CORE_STRATEGY_LAZY_ZERO_GRAD_H_
#define FSDP2_CORE_STRATEGY_LAZY_ZERO_GRAD_H_

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <vector>

namespace fsdp2 {
namespace strategy {

// Zeroes gradients by freeing them and gives a zero .grad back, at the next
// step, only to the parameters that got no gradient (see the file comment).
// Not thread-safe; one per optimizer.
class LazyZeroGrad {
 public:
  // Frees the .grad of every parameter of `optimizer` that has one; each
  // counts as zero from now on.
  void zero_grad(torch::optim::Optimizer& optimizer);
  // Gives a zero .grad to each parameter freed by zero_grad() that has
  // received no gradient since, and forgets them all.
  void materialize();

  // The same for part of the parameters (CPU offload steps the optimizer
  // one unit at a time): materialize() for those of `params` freed.
  void materialize(const std::vector<at::Tensor>& params);
  // zero_grad() for `params` alone (after their step).
  void zero_grad(const std::vector<at::Tensor>& params);
  // Parameters freed and not yet given a gradient or a zero one.
  size_t pending() const;

 private:
  std::vector<at::Tensor> freed_;
};

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_LAZY_ZERO_GRAD_H_
