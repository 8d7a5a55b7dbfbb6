// fsdp2/core/kernels/internal/kernel_testing.h
//
// What the kernels' tests share (kernels_test on the CPU, kernels_gpu_test
// on a GPU): running a function forward and backward on fresh leaves with a
// fixed random upstream gradient, and comparing two such runs tensor by
// tensor with a tolerance that names the worst element.
#ifndef FSDP2_CORE_KERNELS_INTERNAL_KERNEL_TESTING_H_
#define FSDP2_CORE_KERNELS_INTERNAL_KERNEL_TESTING_H_

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace fsdp2 {
namespace kernels {
namespace testing {

using Fn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Normal random values, drawn in float64 on the CPU from `seed` (the same
// values for every dtype and device), then cast and moved.
inline at::Tensor Random(at::IntArrayRef shape, uint64_t seed, at::ScalarType dtype,
                         const at::Device& device, double scale = 1.0) {
  at::manual_seed(seed);
  return (at::randn(shape, at::kDouble) * scale).to(device, dtype);
}

// Runs f on copies of `inputs` (those with grad[i] set require grad), then
// backpropagates sum over outputs k of (out_k * u_k), u_k random from
// seed + k, and returns the outputs followed by the inputs' gradients
// (undefined where an input took no gradient), all detached.
inline std::vector<at::Tensor> ForwardBackward(const Fn& f, const std::vector<at::Tensor>& inputs,
                                               const std::vector<bool>& grad, uint64_t seed = 77) {
  std::vector<at::Tensor> leaves;
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor leaf = inputs[i].defined() ? inputs[i].detach().clone() : at::Tensor();
    if (leaf.defined() && grad[i]) leaf.requires_grad_(true);
    leaves.push_back(leaf);
  }
  const std::vector<at::Tensor> outputs = f(leaves);
  at::Tensor loss;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const at::Tensor u = Random(outputs[k].sizes(), seed + k, at::kDouble, outputs[k].device());
    const at::Tensor term = (outputs[k].to(at::kDouble) * u).sum();
    loss = loss.defined() ? loss + term : term;
  }
  loss.backward();
  std::vector<at::Tensor> result;
  for (const at::Tensor& out : outputs) result.push_back(out.detach());
  for (const at::Tensor& leaf : leaves) {
    result.push_back(leaf.defined() && leaf.requires_grad() ? leaf.grad() : at::Tensor());
  }
  return result;
}

// |actual - expected| <= atol + rtol * |expected| everywhere (NaN where
// expected is NaN), compared in float64 on the CPU; a failure names the
// worst element.
inline ::testing::AssertionResult AllClose(const at::Tensor& actual, const at::Tensor& expected,
                                           double rtol, double atol) {
  if (actual.defined() != expected.defined()) {
    return ::testing::AssertionFailure()
           << "defined: " << actual.defined() << " vs " << expected.defined();
  }
  if (!actual.defined()) return ::testing::AssertionSuccess();
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << " vs " << expected.sizes();
  }
  if (actual.scalar_type() != expected.scalar_type()) {
    return ::testing::AssertionFailure()
           << "dtype " << actual.scalar_type() << " vs " << expected.scalar_type();
  }
  const at::Tensor a = actual.detach().to(at::kCPU, at::kDouble).reshape({-1});
  const at::Tensor e = expected.detach().to(at::kCPU, at::kDouble).reshape({-1});
  if (a.numel() == 0) return ::testing::AssertionSuccess();
  const at::Tensor nan_mismatch = a.isnan().ne(e.isnan());
  if (nan_mismatch.any().item<bool>()) {
    return ::testing::AssertionFailure()
           << "NaN at different places, first at " << nan_mismatch.nonzero()[0].item<int64_t>();
  }
  const at::Tensor excess =
      ((a - e).abs() - (atol + rtol * e.abs())).nan_to_num(/*nan=*/-1.0);
  const int64_t worst = excess.argmax().item<int64_t>();
  if (excess[worst].item<double>() > 0) {
    return ::testing::AssertionFailure()
           << "element " << worst << " of " << a.numel() << ": " << a[worst].item<double>()
           << " vs " << e[worst].item<double>() << " (rtol " << rtol << ", atol " << atol << ")";
  }
  return ::testing::AssertionSuccess();
}

// Each tensor of `actual` against the same of `expected`; names[i] says
// which it is in a failure.
inline void ExpectAllClose(const std::vector<at::Tensor>& actual,
                           const std::vector<at::Tensor>& expected,
                           const std::vector<std::string>& names, double rtol, double atol) {
  ASSERT_EQ(actual.size(), expected.size());
  ASSERT_EQ(actual.size(), names.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(AllClose(actual[i], expected[i], rtol, atol)) << names[i];
  }
}

// As ExpectAllClose, with each tensor's absolute tolerance a fraction of
// its largest magnitude: sums over many rows (weight gradients) carry
// rounding errors in proportion to their size, not to each element's.
inline void ExpectAllCloseToScale(const std::vector<at::Tensor>& actual,
                                  const std::vector<at::Tensor>& expected,
                                  const std::vector<std::string>& names, double rtol,
                                  double atol_fraction) {
  ASSERT_EQ(actual.size(), expected.size());
  ASSERT_EQ(actual.size(), names.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    double scale = 0;
    if (expected[i].defined() && expected[i].numel() > 0) {
      scale = expected[i].detach().abs().max().to(at::kCPU, at::kDouble).item<double>();
    }
    EXPECT_TRUE(AllClose(actual[i], expected[i], rtol, atol_fraction * scale)) << names[i];
  }
}

}  // namespace testing
}  // namespace kernels
}  // namespace fsdp2

#endif  // FSDP2_CORE_KERNELS_INTERNAL_KERNEL_TESTING_H_
