#include "core/kernels/rotary.h"

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

// cat(a2, -a1) and cat(-a2, a1) over the halves of the last dimension.
at::Tensor RotateHalf(const at::Tensor& a, bool transpose) {
  const int64_t half = a.size(-1) / 2;
  const at::Tensor lo = a.narrow(-1, 0, half), hi = a.narrow(-1, half, half);
  return transpose ? at::cat({hi, -lo}, -1) : at::cat({-hi, lo}, -1);
}

#ifdef FSDP2_KERNELS_CUDA
// The kernel over `in` (x forward, dy backward): out has in's layout.
at::Tensor RunKernel(bool backward, at::Tensor in, const at::Tensor& cos, const at::Tensor& sin) {
  const c10::cuda::CUDAGuard guard(in.device());
  if (in.stride(3) != 1) in = in.contiguous();
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  at::Tensor out = at::empty_like(in);
  if (out.stride(3) != 1) out = at::empty(in.sizes(), in.options());
  cuda::RotaryLayout layout{in.size(0), in.size(1), in.size(2), in.size(3),
                            {in.stride(0), in.stride(1), in.stride(2)},
                            {out.stride(0), out.stride(1), out.stride(2)}};
  FSDP2_KERNEL_CHECK(cuda::Rotary(internal::ElementTypeOf(in), backward, in.data_ptr(),
                                  c.data_ptr(), s.data_ptr(), layout, out.data_ptr(),
                                  internal::StreamOf(in)));
  return out;
}
#endif

bool UsesKernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return RunsCudaKernel(x) && x.numel() > 0 && cos.scalar_type() == x.scalar_type() &&
         sin.scalar_type() == x.scalar_type() && cos.device() == x.device() &&
         sin.device() == x.device();
}

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
#ifdef FSDP2_KERNELS_CUDA
    if (UsesKernel(x, cos, sin)) return RunKernel(/*backward=*/false, x, cos, sin);
#endif
    return x * cos + RotateHalf(x, /*transpose=*/false) * sin;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& cos = saved[0];
    const at::Tensor& sin = saved[1];
    const at::Tensor& dy = grads[0];
#ifdef FSDP2_KERNELS_CUDA
    if (UsesKernel(dy, cos, sin)) return {RunKernel(/*backward=*/true, dy, cos, sin), {}, {}};
#endif
    return {dy * cos + RotateHalf(dy * sin, /*transpose=*/true), {}, {}};
  }
};

}  // namespace

at::Tensor Rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const bool fits = x.dim() == 4 && x.size(3) % 2 == 0 && cos.dim() == 2 && sin.dim() == 2 &&
                    cos.size(0) == x.size(2) && cos.size(1) == x.size(3) &&
                    sin.sizes() == cos.sizes() && sin.scalar_type() == cos.scalar_type() &&
                    !cos.requires_grad() && !sin.requires_grad();
  if (!fits) return RotaryComposite(x, cos, sin);
  return RotaryFunction::apply(x, cos, sin);
}

at::Tensor RotaryComposite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + RotateHalf(x, /*transpose=*/false) * sin;
}

}  // namespace kernels
}  // namespace fsdp2
