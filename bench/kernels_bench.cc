// fsdp2/bench/kernels_bench.cc
//
// Each kernel of core/kernels against its ATen composite, side by side in
// one run (llm.c's dev/cuda habit: a kernel is kept fast because it is
// timed): forward + backward of the entry point and of the composite at
// GPT-2 small's sizes (768 wide, 3072 MLP, 12 heads of 64, vocabulary
// 50304) or a Llama's (SwiGLU, rotary), the median of --iters runs after
// --warmup, and composite / fused. On a GPU the entry points run their CUDA
// kernels (each run synchronises before the clock is read); on the CPU they
// run their composites through their own backward formulas, so the ratio
// there is about 1 except for the chunked loss. The chunked loss also
// prints the peak memory above its inputs on a GPU.
//
//   bazel run -c opt //bench:kernels -- --device cuda --rows 8192
//   bazel run //bench:kernels -- --device cpu --rows 256 --iters 3
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#ifdef FSDP2_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "examples/flags/flags.h"
#include "core/kernels/dispatch.h"
#include "core/kernels/gelu.h"
#include "core/kernels/layer_norm.h"
#include "core/kernels/linear_cross_entropy.h"
#include "core/kernels/rms_norm.h"
#include "core/kernels/rotary.h"
#include "core/kernels/swiglu.h"

namespace fsdp2 {
namespace {

using Run = std::function<at::Tensor()>;  // a forward; the bench backprops it

struct Setup {
  at::Device device{at::kCPU};
  at::ScalarType dtype = at::kFloat;
  int64_t iters = 10, warmup = 3;
};

void Sync(const Setup& s) {
  if (s.device.is_cuda()) torch::cuda::synchronize();
}

// Median milliseconds of forward + backward (sum of the output).
double Time(const Setup& s, const Run& run) {
  std::vector<double> ms;
  for (int64_t i = 0; i < s.warmup + s.iters; ++i) {
    Sync(s);
    const auto start = std::chrono::steady_clock::now();
    run().sum().backward();
    Sync(s);
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    if (i >= s.warmup) ms.push_back(took.count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

at::Tensor Leaf(const Setup& s, at::IntArrayRef shape, double scale = 1.0) {
  return (at::randn(shape, at::TensorOptions().device(s.device)) * scale)
      .to(s.dtype)
      .requires_grad_(true);
}

void Row(const Setup& s, const char* name, const Run& fused, const Run& composite) {
  const double f = Time(s, fused), c = Time(s, composite);
  std::printf("%-26s %10.3f %12.3f %8.2fx\n", name, f, c, c / f);
}

int Main(int argc, char** argv) {
  flags::Flags flags(argc, argv, "usage: kernels [--device cpu|cuda] [--dtype bf16|f32] ...");
  const std::string device = flags.String(
      "device", torch::cuda::is_available() ? "cuda" : "cpu", "cpu or cuda (default: cuda if any)");
  const std::string dtype = flags.String("dtype", "bf16", "bf16 or f32");
  const int64_t rows = flags.Int("rows", 8192, "tokens (batch x sequence)");
  const int64_t seq = flags.Int("seq", 1024, "sequence length (rotary)");
  Setup s;
  s.iters = flags.Int("iters", 10, "timed runs (the median is printed)");
  s.warmup = flags.Int("warmup", 3, "untimed runs first");
  flags.Finish();
  s.device = at::Device(device);
  s.dtype = dtype == "f32" ? at::kFloat : at::kBFloat16;
  const int64_t c = 768, hidden = 3072, vocab = 50304, heads = 12, head_dim = 64;
  const bool cuda_kernels =
      kernels::RunsCudaKernel(at::empty({1}, at::TensorOptions().device(s.device).dtype(s.dtype)));
  std::printf("kernels on %s, %s, %lld rows; CUDA kernels %s\n", device.c_str(), dtype.c_str(),
              static_cast<long long>(rows), cuda_kernels ? "running" : "not running (composites)");
  std::printf("%-26s %10s %12s %9s\n", "kernel", "fused ms", "composite ms", "ratio");

  const at::Tensor x = Leaf(s, {rows, c}), r = Leaf(s, {rows, c});
  const at::Tensor w = Leaf(s, {c}, 0.1), b = Leaf(s, {c}, 0.1);
  Row(s, "add + layer_norm", [&] { return kernels::AddLayerNorm(x, r, w, b).normed; },
      [&] { return kernels::AddLayerNormComposite(x, r, w, b).normed; });
  Row(s, "add + rms_norm", [&] { return kernels::AddRmsNorm(x, r, w, 1e-6).normed; },
      [&] { return kernels::RmsNormComposite(x + r, w, 1e-6); });

  const at::Tensor fc = Leaf(s, {hidden, c}, 0.02), fc_bias = Leaf(s, {hidden}, 0.02);
  Row(s, "linear + bias + gelu(tanh)", [&] { return kernels::LinearGelu(x, fc, fc_bias); },
      [&] { return kernels::LinearGeluComposite(x, fc, fc_bias); });

  const at::Tensor gate = Leaf(s, {rows, hidden}), up = Leaf(s, {rows, hidden});
  Row(s, "swiglu", [&] { return kernels::Swiglu(gate, up); },
      [&] { return kernels::SwigluComposite(gate, up); });

  const int64_t batch = std::max<int64_t>(1, rows / seq);
  const at::Tensor q = Leaf(s, {batch, seq, heads, head_dim});
  const at::Tensor inv_freq = at::pow(
      10000.0, -at::arange(0, head_dim, 2, at::kDouble) / static_cast<double>(head_dim));
  const at::Tensor freqs = at::arange(seq, at::kDouble).unsqueeze(1) * inv_freq.unsqueeze(0);
  const at::Tensor angles = at::cat({freqs, freqs}, -1).to(s.device);
  const at::Tensor cos = angles.cos().to(s.dtype), sin = angles.sin().to(s.dtype);
  Row(s, "rotary", [&] { return kernels::Rotary(q.transpose(1, 2), cos, sin); },
      [&] { return kernels::RotaryComposite(q.transpose(1, 2), cos, sin); });

  const at::Tensor head = Leaf(s, {vocab, c}, 0.02);
  const at::Tensor targets =
      at::randint(vocab, {rows}, at::TensorOptions().dtype(at::kLong).device(s.device));
  Row(s, "linear + cross_entropy", [&] { return kernels::LinearCrossEntropy(x, head, targets); },
      [&] { return kernels::LinearCrossEntropyComposite(x, head, targets); });
#ifdef FSDP2_WITH_CUDA
  if (s.device.is_cuda()) {
    for (bool fused : {true, false}) {
      x.mutable_grad() = at::Tensor();
      head.mutable_grad() = at::Tensor();
      Sync(s);
      const auto index = s.device.index() < 0 ? 0 : s.device.index();
      const auto base =
          c10::cuda::CUDACachingAllocator::getDeviceStats(index).allocated_bytes[0].current;
      c10::cuda::CUDACachingAllocator::resetPeakStats(index);
      (fused ? kernels::LinearCrossEntropy(x, head, targets)
             : kernels::LinearCrossEntropyComposite(x, head, targets))
          .backward();
      Sync(s);
      const auto peak =
          c10::cuda::CUDACachingAllocator::getDeviceStats(index).allocated_bytes[0].peak - base;
      std::printf("linear + cross_entropy peak above its inputs, %s: %.0f MB\n",
                  fused ? "fused" : "composite", peak / 1e6);
    }
  }
#endif
  return 0;
}

}  // namespace
}  // namespace fsdp2

int main(int argc, char** argv) {
  try {
    return fsdp2::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernels: %s\n", e.what());
    return 1;
  }
}
