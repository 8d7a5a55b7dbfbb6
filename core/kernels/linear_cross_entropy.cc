#include "core/kernels/linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "core/kernels/dispatch.h"
#ifdef FSDP2_KERNELS_CUDA
#include "core/kernels/internal/cuda_launch.h"
#endif

namespace fsdp2 {
namespace kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kChunkBytes = int64_t(256) << 20;

// The loss of each row of `logits` [n, V] against `targets` [n], in the
// compute dtype (float32, float64 for float64); 0 on ignored rows. With
// `grad_scale` (a scalar on logits' device, in the compute dtype) the
// logits are overwritten with their gradient, (softmax - onehot) *
// grad_scale, 0 on ignored rows.
at::Tensor CrossEntropyRows(at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index,
                            const at::Tensor& grad_scale) {
#ifdef FSDP2_KERNELS_CUDA
  if (RunsCudaKernel(logits) && logits.is_contiguous() && logits.numel() > 0) {
    const c10::cuda::CUDAGuard guard(logits.device());
    at::Tensor losses = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
    FSDP2_KERNEL_CHECK(cuda::CrossEntropyRows(
        internal::ElementTypeOf(logits), logits.data_ptr(), targets.data_ptr<int64_t>(),
        logits.size(0), logits.size(1), ignore_index,
        grad_scale.defined() ? grad_scale.data_ptr<float>() : nullptr, losses.data_ptr<float>(),
        internal::StreamOf(logits)));
    return losses;
  }
#endif
  const at::ScalarType compute = at::promote_types(logits.scalar_type(), at::kFloat);
  const at::Tensor z = logits.to(compute);
  const at::Tensor lse = z.logsumexp(1);
  const at::Tensor ignored = targets == ignore_index;
  const at::Tensor safe = targets.masked_fill(ignored, 0).unsqueeze(1);
  const at::Tensor losses = (lse - z.gather(1, safe).squeeze(1)).masked_fill(ignored, 0);
  if (grad_scale.defined()) {
    const at::Tensor weight = ignored.logical_not().to(compute).unsqueeze(1);
    at::Tensor d = (z - lse.unsqueeze(1)).exp_();
    d.scatter_add_(1, safe, weight.neg());
    d.mul_(weight * grad_scale);
    logits.copy_(d);
  }
  return losses;
}

struct Result {
  at::Tensor loss;     // scalar, the compute dtype
  at::Tensor dx;       // [N, C] in x's dtype, or undefined
  at::Tensor dweight;  // [V, C] in the compute dtype, or undefined
};

// The chunked loss, and the gradients asked for (of the mean loss).
Result Run(const at::Tensor& x2, const at::Tensor& weight, const at::Tensor& targets,
           const LinearCrossEntropyOptions& options, bool want_dx, bool want_dweight) {
  const int64_t n = x2.size(0), vocab = weight.size(0);
  const at::ScalarType compute = at::promote_types(x2.scalar_type(), at::kFloat);
  const at::TensorOptions on_device = x2.options().dtype(compute);
  // A tensor on the device, not a number: no wait for the device here.
  const at::Tensor count = (targets != options.ignore_index).sum().to(compute);
  const at::Tensor grad_scale = want_dx || want_dweight ? count.reciprocal() : at::Tensor();
  at::Tensor loss_sum = at::zeros({}, on_device);
  Result r;
  if (want_dx) r.dx = at::empty(x2.sizes(), x2.options());
  if (want_dweight) r.dweight = at::zeros(weight.sizes(), on_device);
  const int64_t rows =
      options.chunk_rows > 0
          ? options.chunk_rows
          : std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, vocab * x2.element_size()));
  const at::Tensor weight_t = weight.t();
  for (int64_t start = 0; start < n; start += rows) {
    const int64_t m = std::min(rows, n - start);
    const at::Tensor x_chunk = x2.narrow(0, start, m);
    at::Tensor logits = at::mm(x_chunk, weight_t);
    loss_sum.add_(CrossEntropyRows(logits, targets.narrow(0, start, m), options.ignore_index,
                                   grad_scale)
                      .sum());
    // `logits` now holds their gradient.
    if (want_dx) {
      at::Tensor dx_chunk = r.dx.narrow(0, start, m);
      at::mm_out(dx_chunk, logits, weight);
    }
    if (want_dweight) {
      if (logits.scalar_type() == compute) {
        r.dweight.addmm_(logits.t(), x_chunk);
      } else {
        r.dweight.add_(at::mm(logits.t(), x_chunk));
      }
    }
  }
  r.loss = loss_sum / count;
  return r;
}

class LinearCrossEntropyFunction
    : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t ignore_index, int64_t chunk_rows) {
    LinearCrossEntropyOptions options;
    options.ignore_index = ignore_index;
    options.chunk_rows = chunk_rows;
    Result r = Run(x.reshape({-1, x.size(-1)}), weight, targets.reshape({-1}), options,
                   x.requires_grad(), weight.requires_grad());
    ctx->save_for_backward({r.dx, r.dweight});
    ctx->saved_data["x_shape"] = x.sizes();
    ctx->saved_data["weight_type"] = static_cast<int64_t>(weight.scalar_type());
    return r.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    at::Tensor dx, dweight;
    if (saved[0].defined()) {
      // In x's dtype: no float32 copy of x's gradient.
      dx = (saved[0] * g.to(saved[0].scalar_type()))
               .view(ctx->saved_data["x_shape"].toIntVector());
    }
    if (saved[1].defined()) {
      const auto type = static_cast<at::ScalarType>(ctx->saved_data["weight_type"].toInt());
      dweight = (saved[1] * g).to(type);
    }
    return {dx, dweight, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor LinearCrossEntropy(const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& targets, const LinearCrossEntropyOptions& options) {
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 2 && weight.size(1) == x.size(-1),
              "LinearCrossEntropy: weight must be [vocab, ", x.dim() >= 1 ? x.size(-1) : 0,
              "], got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.device() == x.device(),
              "LinearCrossEntropy: x and weight must share dtype and device; got ",
              x.scalar_type(), " on ", x.device(), " and ", weight.scalar_type(), " on ",
              weight.device());
  TORCH_CHECK(!at::isFloatingType(targets.scalar_type()) && !targets.is_complex() &&
                  targets.numel() * x.size(-1) == x.numel(),
              "LinearCrossEntropy: targets must be integers, one per row of x (",
              x.numel() / std::max<int64_t>(1, x.size(-1)), "); got ", targets.sizes(), " ",
              targets.scalar_type());
  TORCH_CHECK(options.chunk_rows >= 0, "LinearCrossEntropy: chunk_rows must be >= 0, got ",
              options.chunk_rows);
  const at::Tensor t = targets.to(x.device(), at::kLong).contiguous();
  const bool grad =
      c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  if (!grad) {
    return Run(x.reshape({-1, x.size(-1)}), weight, t.reshape({-1}), options, false, false).loss;
  }
  return LinearCrossEntropyFunction::apply(x, weight, t, options.ignore_index, options.chunk_rows);
}

at::Tensor LinearCrossEntropyComposite(const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& targets, int64_t ignore_index) {
  const at::ScalarType compute = at::promote_types(x.scalar_type(), at::kFloat);
  const at::Tensor logits = at::linear(x, weight).to(compute);
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                targets.reshape({-1}).to(at::kLong), {}, at::Reduction::Mean,
                                ignore_index);
}

}  // namespace kernels
}  // namespace fsdp2
