#include "core/kernels/swiglu.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/kernels/dispatch.h"
#ifdef FSDP2_KERNELS_CUDA
#include "core/kernels/internal/cuda_launch.h"
#endif

namespace fsdp2 {
namespace kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool UsesKernel(const at::Tensor& gate) { return RunsCudaKernel(gate) && gate.numel() > 0; }

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
#ifdef FSDP2_KERNELS_CUDA
    if (UsesKernel(gate)) {
      const c10::cuda::CUDAGuard guard(gate.device());
      const at::Tensor g = gate.contiguous(), u = up.contiguous();
      at::Tensor y = at::empty(gate.sizes(), g.options());
      FSDP2_KERNEL_CHECK(cuda::SwigluForward(internal::ElementTypeOf(g), g.data_ptr(),
                                             u.data_ptr(), g.numel(), y.data_ptr(),
                                             internal::StreamOf(g)));
      return y;
    }
#endif
    return at::silu(gate) * up;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& gate = saved[0];
    const at::Tensor& up = saved[1];
    const at::Tensor& dy = grads[0];
#ifdef FSDP2_KERNELS_CUDA
    if (UsesKernel(gate) && dy.scalar_type() == gate.scalar_type()) {
      const c10::cuda::CUDAGuard guard(gate.device());
      const at::Tensor d = dy.contiguous(), g = gate.contiguous(), u = up.contiguous();
      at::Tensor dgate = at::empty(gate.sizes(), g.options());
      at::Tensor dup = at::empty(gate.sizes(), g.options());
      FSDP2_KERNEL_CHECK(cuda::SwigluBackward(internal::ElementTypeOf(g), d.data_ptr(),
                                              g.data_ptr(), u.data_ptr(), g.numel(),
                                              dgate.data_ptr(), dup.data_ptr(),
                                              internal::StreamOf(g)));
      return {dgate, dup};
    }
#endif
    // What autograd computes for at::silu(gate) * up.
    return {at::silu_backward(dy * up, gate), dy * at::silu(gate)};
  }
};

}  // namespace

at::Tensor Swiglu(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type() &&
                  gate.device() == up.device(),
              "Swiglu: gate and up must have the same shape, dtype and device; got ",
              gate.sizes(), " ", gate.scalar_type(), " on ", gate.device(), " and ", up.sizes(),
              " ", up.scalar_type(), " on ", up.device());
  return SwigluFunction::apply(gate, up);
}

at::Tensor SwigluComposite(const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(gate) * up;
}

}  // namespace kernels
}  // namespace fsdp2
