// fsdp2/core/strategy/fused_adamw.h
//
// FusedAdamW: LibTorch's AdamW (torch::optim::AdamW, same options, same
// state and state dict, so checkpoints and dynamic_casts are unaffected)
// whose step updates each parameter in one pass over its elements instead
// of LibTorch's nine whole-tensor operations (weight decay, two moments,
// the square root, the denominator, the update). The arithmetic is the same
// as LibTorch's, operation by operation in the parameter's dtype (with the
// fused multiply-adds ATen's AVX2 / AVX-512 kernels use for add_ and
// addcmul_, and without them where ATen runs its plain kernels, and ATen's
// own square root, which in PyTorch's wheels is MKL's and not correctly
// rounded), so the results are bit-identical (optimizer_test checks it);
// only the memory traffic falls. A step over 42.6M fp32 parameters (a
// rank's shard of the 85M GPT at N = 2), one core: LibTorch 2.11's AdamW
// 367-383 ms, this one 302-304 ms (2-core AMD EPYC, AVX2); on LibTorch 1.13,
// whose std::sqrt-exact square root needed no separate pass, 259 against
// 141 ms on an AVX-512 EPYC.
//
// On CUDA the step is PyTorch's own fused AdamW kernel (step_on_gpu below).
//
// When a parameter is not a dense, contiguous float or double CPU tensor
// with a gradient (and a state, if it has one yet) of the same kind, or a
// group has amsgrad, the whole step is LibTorch's own.
#ifndef FSDP2_CORE_STRATEGY_FUSED_ADAMW_H_
#define FSDP2_CORE_STRATEGY_FUSED_ADAMW_H_

#include <torch/optim/adamw.h>

#include <vector>

namespace fsdp2 {
namespace strategy {

// A torch::optim::AdamW whose step() is fused (see the file comment): a
// drop-in, bit-identical replacement with the same state dict.
class FusedAdamW : public torch::optim::AdamW {
 public:
  // As torch::optim::AdamW's constructor: one group over `params`.
  FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions options)
      : torch::optim::AdamW(std::move(params), std::move(options)) {}

  // One AdamW step over every parameter with a gradient: the GPU kernel
  // (only without a closure), the fused CPU pass, or LibTorch's step where
  // neither applies. Returns
  // the closure's loss (undefined without a closure), as AdamW::step does.
  at::Tensor step(LossClosure closure = nullptr) override;

 private:
  // `p`'s state, made as LibTorch's AdamW makes it (step 0, zero moments)
  // if it has none yet.
  torch::optim::AdamWParamState& state_of(const at::Tensor& p);
  // On CUDA (every parameter with a gradient a dense contiguous float,
  // double, half or bf16 CUDA tensor, its gradient and state alike, no
  // amsgrad): the step as PyTorch's AdamW(fused=True) takes it, one
  // multi-tensor kernel (at::_fused_adamw_) per device, dtype and step
  // count, with LibTorch's state (step counts on the host, exp_avg and
  // exp_avg_sq) kept as LibTorch's AdamW keeps it. Returns false, having
  // changed nothing, where that does not apply.
  bool step_on_gpu();
};

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_FUSED_ADAMW_H_
