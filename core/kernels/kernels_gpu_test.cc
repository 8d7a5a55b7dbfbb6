// The CUDA kernels of core/kernels against their ATen composites on a GPU:
// for each entry point, float32 and bfloat16, odd sizes and a model's
// sizes, the outputs and every input's gradient of the kernel (the entry
// point on a CUDA tensor) against the plain composite on the same device
// through autograd; the chunked linear + cross-entropy also against float64
// on the CPU, and its peak memory against the composite's. Built in every
// run; where no CUDA device is visible, or the build has no CUDA kernels, it
// prints a SKIPPED: line and runs nothing, unless FSDP2_REQUIRE_GPU=1, which
// makes that a failure (the GPU machine's check sets it).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#ifdef FSDP2_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "core/kernels/dispatch.h"
#include "core/kernels/gelu.h"
#include "core/kernels/internal/kernel_testing.h"
#include "core/kernels/layer_norm.h"
#include "core/kernels/linear_cross_entropy.h"
#include "core/kernels/rms_norm.h"
#include "core/kernels/rotary.h"
#include "core/kernels/swiglu.h"
#include "core/models/gpt.h"

namespace fsdp2 {
namespace kernels {
namespace {

using testing::ExpectAllCloseToScale;
using testing::ForwardBackward;
using testing::Random;

struct Precision {
  at::ScalarType dtype;
  double rtol, atol_fraction;
};

// float32: the kernels and the composite differ in summation order only;
// bfloat16: by about a unit in the last place (2^-8) where they round.
const Precision kPrecisions[] = {{at::kFloat, 1e-4, 1e-5}, {at::kBFloat16, 2e-2, 1e-2}};

// FSDP2_GPU_TEST_DRY_RUN=1: every "GPU" tensor below is on the CPU (the
// composites against themselves), so that the tests' own code runs on a
// machine without a GPU; the kernel and memory checks skip.
bool DryRun() {
  const char* v = std::getenv("FSDP2_GPU_TEST_DRY_RUN");
  return v != nullptr && std::string(v) == "1";
}
const at::Device kGpu = DryRun() ? at::Device(at::kCPU) : at::Device(at::kCUDA, 0);

std::string Name(const Precision& p) { return std::string(c10::toString(p.dtype)); }

using Shape = std::vector<int64_t>;

// Compares f with g forward and backward on `in` (grad as given).
void Compare(const testing::Fn& f, const testing::Fn& g, const std::vector<at::Tensor>& in,
             const std::vector<bool>& grad, const std::vector<std::string>& names,
             const Precision& p) {
  ExpectAllCloseToScale(ForwardBackward(f, in, grad), ForwardBackward(g, in, grad), names, p.rtol,
                        p.atol_fraction);
}

TEST(KernelsGpuTest, TheKernelsRunOnCudaTensors) {
  if (DryRun()) GTEST_SKIP() << "dry run";
  EXPECT_TRUE(RunsCudaKernel(at::ones({2}, at::TensorOptions().device(kGpu))));
  EXPECT_TRUE(RunsCudaKernel(at::ones({2}, at::TensorOptions().device(kGpu).dtype(at::kBFloat16))));
  EXPECT_FALSE(RunsCudaKernel(at::ones({2}, at::TensorOptions().device(kGpu).dtype(at::kDouble))));
}

TEST(KernelsGpuTest, AddLayerNorm) {
  for (const Precision& p : kPrecisions) {
    for (const Shape& shape : {Shape{4, 333, 771}, Shape{2, 1024, 768}, Shape{3, 5, 4100}}) {
      SCOPED_TRACE(Name(p) + " " + c10::str(at::IntArrayRef(shape)));
      const int64_t c = shape.back();
      const std::vector<at::Tensor> in = {
          Random(shape, 1, p.dtype, kGpu), Random(shape, 2, p.dtype, kGpu),
          Random({c}, 3, p.dtype, kGpu).add(1), Random({c}, 4, p.dtype, kGpu)};
      auto fused = [](const std::vector<at::Tensor>& t) {
        AddNormResult r = AddLayerNorm(t[0], t[1], t[2], t[3], 1e-5);
        return std::vector<at::Tensor>{r.sum, r.normed};
      };
      auto composite = [](const std::vector<at::Tensor>& t) {
        AddNormResult r = AddLayerNormComposite(t[0], t[1], t[2], t[3], 1e-5);
        return std::vector<at::Tensor>{r.sum, r.normed};
      };
      Compare(fused, composite, in, {true, true, true, true},
              {"sum", "normed", "dx", "dresidual", "dweight", "dbias"}, p);
      auto plain = [](bool use_kernel) {
        return [use_kernel](const std::vector<at::Tensor>& t) {
          return std::vector<at::Tensor>{
              use_kernel ? LayerNorm(t[0], t[2], t[3], 1e-5)
                         : at::layer_norm(t[0], {t[0].size(-1)}, t[2], t[3], 1e-5)};
        };
      };
      Compare(plain(true), plain(false), in, {true, false, true, true},
              {"y", "dx", "dresidual", "dweight", "dbias"}, p);
    }
  }
}

TEST(KernelsGpuTest, AddRmsNorm) {
  for (const Precision& p : kPrecisions) {
    for (const Shape& shape : {Shape{3, 257, 1029}, Shape{2, 512, 1024}}) {
      SCOPED_TRACE(Name(p) + " " + c10::str(at::IntArrayRef(shape)));
      const std::vector<at::Tensor> in = {Random(shape, 5, p.dtype, kGpu),
                                          Random(shape, 6, p.dtype, kGpu),
                                          Random({shape.back()}, 7, p.dtype, kGpu).add(1)};
      auto fused = [](const std::vector<at::Tensor>& t) {
        AddNormResult r = AddRmsNorm(t[0], t[1], t[2], 1e-6);
        return std::vector<at::Tensor>{r.sum, r.normed, RmsNorm(t[0], t[2], 1e-6)};
      };
      auto composite = [](const std::vector<at::Tensor>& t) {
        const at::Tensor h = t[0] + t[1];
        return std::vector<at::Tensor>{h, RmsNormComposite(h, t[2], 1e-6),
                                       RmsNormComposite(t[0], t[2], 1e-6)};
      };
      Compare(fused, composite, in, {true, true, true},
              {"sum", "normed", "plain", "dx", "dresidual", "dweight"}, p);
    }
  }
}

TEST(KernelsGpuTest, LinearGelu) {
  for (const Precision& p : kPrecisions) {
    for (const std::string approximate : {"tanh", "none"}) {
      SCOPED_TRACE(Name(p) + " " + approximate);
      const std::vector<at::Tensor> in = {Random({5, 77, 257}, 8, p.dtype, kGpu),
                                          Random({1031, 257}, 9, p.dtype, kGpu, 0.1),
                                          Random({1031}, 10, p.dtype, kGpu)};
      auto fused = [approximate](const std::vector<at::Tensor>& t) {
        return std::vector<at::Tensor>{LinearGelu(t[0], t[1], t[2], approximate)};
      };
      auto composite = [approximate](const std::vector<at::Tensor>& t) {
        return std::vector<at::Tensor>{LinearGeluComposite(t[0], t[1], t[2], approximate)};
      };
      Compare(fused, composite, in, {true, true, true}, {"y", "dx", "dweight", "dbias"}, p);
      // Without gradients: cuBLASLt's GELU epilogue (tanh).
      c10::NoGradGuard no_grad;
      ExpectAllCloseToScale({LinearGelu(in[0], in[1], in[2], approximate)},
                            {LinearGeluComposite(in[0], in[1], in[2], approximate)},
                            {"y without gradients"}, p.rtol, p.atol_fraction);
    }
  }
}

TEST(KernelsGpuTest, Swiglu) {
  for (const Precision& p : kPrecisions) {
    SCOPED_TRACE(Name(p));
    const std::vector<at::Tensor> in = {Random({3, 301, 1377}, 11, p.dtype, kGpu, 2.0),
                                        Random({3, 301, 1377}, 12, p.dtype, kGpu)};
    auto fused = [](const std::vector<at::Tensor>& t) {
      return std::vector<at::Tensor>{Swiglu(t[0], t[1])};
    };
    auto composite = [](const std::vector<at::Tensor>& t) {
      return std::vector<at::Tensor>{SwigluComposite(t[0], t[1])};
    };
    Compare(fused, composite, in, {true, true}, {"y", "dgate", "dup"}, p);
  }
}

TEST(KernelsGpuTest, Rotary) {
  for (const Precision& p : kPrecisions) {
    // [batch, seq, heads, dim] leaves, seen as [batch, heads, seq, dim].
    for (const Shape& shape : {Shape{2, 131, 5, 66}, Shape{4, 256, 16, 64}}) {
      SCOPED_TRACE(Name(p) + " " + c10::str(at::IntArrayRef(shape)));
      const int64_t seq = shape[1], dim = shape[3];
      const at::Tensor inv_freq =
          at::pow(10000.0, -at::arange(0, dim, 2, at::kDouble) / static_cast<double>(dim));
      const at::Tensor freqs = at::arange(seq, at::kDouble).unsqueeze(1) * inv_freq.unsqueeze(0);
      const at::Tensor angles = at::cat({freqs, freqs}, -1).to(kGpu);
      const std::vector<at::Tensor> in = {Random(shape, 13, p.dtype, kGpu),
                                          angles.cos().to(p.dtype), angles.sin().to(p.dtype)};
      auto fused = [](const std::vector<at::Tensor>& t) {
        return std::vector<at::Tensor>{Rotary(t[0].transpose(1, 2), t[1], t[2])};
      };
      auto composite = [](const std::vector<at::Tensor>& t) {
        return std::vector<at::Tensor>{RotaryComposite(t[0].transpose(1, 2), t[1], t[2])};
      };
      Compare(fused, composite, in, {true, false, false}, {"y", "dx", "dcos", "dsin"}, p);
    }
  }
}

TEST(KernelsGpuTest, LinearCrossEntropy) {
  for (const Precision& p : kPrecisions) {
    for (int64_t chunk_rows : {0, 97}) {
      SCOPED_TRACE(Name(p) + " chunk_rows " + std::to_string(chunk_rows));
      at::Tensor targets = at::arange(3 * 335, at::kLong).mul(7919).remainder(32003).view({3, 335});
      targets.narrow(1, 0, 40).fill_(-100);
      targets = targets.to(kGpu);
      const std::vector<at::Tensor> in = {Random({3, 335, 128}, 14, p.dtype, kGpu),
                                          Random({32003, 128}, 15, p.dtype, kGpu, 0.2)};
      LinearCrossEntropyOptions o;
      o.chunk_rows = chunk_rows;
      auto fused = [&](const std::vector<at::Tensor>& t) {
        return std::vector<at::Tensor>{LinearCrossEntropy(t[0], t[1], targets, o)};
      };
      auto composite = [&](const std::vector<at::Tensor>& t) {
        return std::vector<at::Tensor>{LinearCrossEntropyComposite(t[0], t[1], targets)};
      };
      const std::vector<std::string> names = {"loss", "dx", "dweight"};
      const std::vector<at::Tensor> got = ForwardBackward(fused, in, {true, true});
      ExpectAllCloseToScale(got, ForwardBackward(composite, in, {true, true}), names, p.rtol,
                            p.atol_fraction);
      // Against float64 on the CPU from the same inputs: the kernel computes
      // in float32 from the chunk's logits in the input dtype.
      std::vector<at::Tensor> exact = ForwardBackward(
          [&](const std::vector<at::Tensor>& t) {
            return std::vector<at::Tensor>{
                LinearCrossEntropyComposite(t[0], t[1], targets.to(at::kCPU))};
          },
          {in[0].to(at::kCPU, at::kDouble), in[1].to(at::kCPU, at::kDouble)}, {true, true});
      for (size_t i = 0; i < exact.size(); ++i) exact[i] = exact[i].to(got[i].scalar_type());
      ExpectAllCloseToScale(got, exact, names, p.rtol, p.atol_fraction);
    }
  }
}

// The built-in GPT on the GPU (its LayerNorms, ln2 fused with the residual
// add, and the fused chunked head and loss) against the same weights on the
// CPU, where it runs today's ATen ops: the loss and every parameter's
// gradient, float32 (GPU float32 vs CPU float32) and bfloat16 (against
// the CPU's float32).
TEST(KernelsGpuTest, GptOnTheGpuMatchesTheCpu) {
  models::GPTConfig config;
  config.vocab_size = 1003;
  config.block_size = 64;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_embd = 96;
  torch::manual_seed(21);
  models::GPT cpu(config);
  const at::Tensor tokens = at::randint(config.vocab_size, {3, 65}, at::kLong);
  at::Tensor targets = tokens.narrow(1, 1, 64).clone();
  targets.index_put_({0, 5}, -100);
  const at::Tensor inputs = tokens.narrow(1, 0, 64);
  const at::Tensor want = cpu->forward(inputs, targets);
  want.backward();
  for (const Precision& p : kPrecisions) {
    SCOPED_TRACE(Name(p));
    models::GPT gpu(config);
    {
      c10::NoGradGuard no_grad;
      auto src = cpu->parameters(), dst = gpu->parameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
    }
    gpu->to(kGpu, p.dtype);
    const at::Tensor got = gpu->forward(inputs.to(kGpu), targets.to(kGpu));
    got.backward();
    const double rtol = p.dtype == at::kFloat ? 1e-4 : 2e-2;
    const double atol = p.dtype == at::kFloat ? 1e-5 : 5e-2;
    EXPECT_TRUE(testing::AllClose(got.to(at::kCPU, at::kFloat), want, rtol, 0)) << "loss";
    const auto named_cpu = cpu->named_parameters(), named_gpu = gpu->named_parameters();
    for (const auto& item : named_cpu) {
      const at::Tensor expected = item.value().grad();
      const at::Tensor actual = named_gpu[item.key()].grad().to(at::kCPU, at::kFloat);
      const double scale = expected.abs().max().item<double>();
      EXPECT_TRUE(testing::AllClose(actual, expected, rtol, atol * scale)) << item.key();
    }
  }
}

#ifdef FSDP2_WITH_CUDA
// The point of chunking: GPT-2's vocabulary at 8 x 1024 tokens, bfloat16.
// The whole batch's float32 logits would be 1.65 GB; the chunked loss and
// both gradients must peak well under that, and under the composite.
TEST(KernelsGpuTest, LinearCrossEntropyNeverHoldsTheBatchLogits) {
  if (DryRun()) GTEST_SKIP() << "dry run";
  const int64_t rows = 8 * 1024, vocab = 50304, width = 768;
  const at::Tensor x = Random({rows, width}, 16, at::kBFloat16, kGpu).requires_grad_(true);
  const at::Tensor w = Random({vocab, width}, 17, at::kBFloat16, kGpu, 0.02).requires_grad_(true);
  const at::Tensor targets = at::arange(rows, at::kLong).mul(31).remainder(vocab).to(kGpu);
  auto peak_of = [&](bool fused) {
    x.mutable_grad() = at::Tensor();
    w.mutable_grad() = at::Tensor();
    torch::cuda::synchronize();
    const auto base = c10::cuda::CUDACachingAllocator::getDeviceStats(0)
                          .allocated_bytes[0].current;
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    (fused ? LinearCrossEntropy(x, w, targets) : LinearCrossEntropyComposite(x, w, targets))
        .backward();
    torch::cuda::synchronize();
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak - base;
  };
  const int64_t fused = peak_of(true), composite = peak_of(false);
  const int64_t float_logits = rows * vocab * 4;
  std::printf("peak above the inputs: fused %.0f MB, composite %.0f MB, fp32 logits %.0f MB\n",
              fused / 1e6, composite / 1e6, float_logits / 1e6);
  EXPECT_LT(fused, float_logits / 2);
  EXPECT_LT(fused, composite);
}
#endif

}  // namespace
}  // namespace kernels
}  // namespace fsdp2

int main(int argc, char** argv) {
  const char* require = std::getenv("FSDP2_REQUIRE_GPU");
  const bool required = require != nullptr && std::string(require) == "1";
  const char* missing = nullptr;
  if (fsdp2::kernels::DryRun()) {
    std::printf("kernels_gpu_test: dry run on the CPU (FSDP2_GPU_TEST_DRY_RUN=1)\n");
  } else if (!fsdp2::kernels::CudaKernelsBuilt()) {
    missing = "this build has no CUDA kernels (no nvcc, no CUDA LibTorch, or "
              "--define=fsdp2_cuda_kernels=off)";
  } else if (!torch::cuda::is_available()) {
    missing = "no CUDA device is visible";
  }
  if (missing != nullptr) {
    if (required) {
      std::printf("FAILED: kernels_gpu_test: FSDP2_REQUIRE_GPU=1 but %s\n", missing);
      return 1;
    }
    std::printf("SKIPPED: kernels_gpu_test: %s\n", missing);
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
