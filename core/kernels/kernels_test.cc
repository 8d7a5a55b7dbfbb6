// The entry points of core/kernels on the CPU, each against its plain ATen
// composite through autograd: outputs and every input's gradient, float64
// (tight), float32 and bfloat16, on odd sizes. On the CPU an entry point
// runs its own forward and backward formulas (a torch::autograd::Function),
// the formulas its CUDA kernel implements, so these tests check them; the
// chunked linear + cross-entropy is checked over chunk sizes that do and do
// not divide the rows. kernels_gpu_test runs the same comparisons on CUDA.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/kernels/dispatch.h"
#include "core/kernels/gelu.h"
#include "core/kernels/internal/kernel_testing.h"
#include "core/kernels/layer_norm.h"
#include "core/kernels/linear_cross_entropy.h"
#include "core/kernels/rms_norm.h"
#include "core/kernels/rotary.h"
#include "core/kernels/swiglu.h"

namespace fsdp2 {
namespace kernels {
namespace {

using testing::ExpectAllClose;
using testing::ForwardBackward;
using testing::Random;

struct Precision {
  at::ScalarType dtype;
  double rtol, atol;
};

// float64 must agree to rounding; bfloat16 to about one unit in its last
// place (2^-8 relative).
const Precision kPrecisions[] = {
    {at::kDouble, 1e-10, 1e-12}, {at::kFloat, 1e-5, 1e-5}, {at::kBFloat16, 2e-2, 2e-2}};

const at::Device kCpu(at::kCPU);

std::string Name(const Precision& p) { return std::string(c10::toString(p.dtype)); }

TEST(LayerNormTest, MatchesCompositeWithAndWithoutAffine) {
  for (const Precision& p : kPrecisions) {
    SCOPED_TRACE(Name(p));
    const at::Tensor x = Random({3, 5, 37}, 1, p.dtype, kCpu);
    const at::Tensor w = Random({37}, 2, p.dtype, kCpu).add(1);
    const at::Tensor b = Random({37}, 3, p.dtype, kCpu);
    for (bool affine : {true, false}) {
      SCOPED_TRACE(affine ? "affine" : "no affine");
      const std::vector<at::Tensor> in = {x, affine ? w : at::Tensor(), affine ? b : at::Tensor()};
      auto fused = [](const std::vector<at::Tensor>& t) {
        return std::vector<at::Tensor>{LayerNorm(t[0], t[1], t[2], 1e-5)};
      };
      auto composite = [](const std::vector<at::Tensor>& t) {
        return std::vector<at::Tensor>{at::layer_norm(t[0], {t[0].size(-1)}, t[1], t[2], 1e-5)};
      };
      ExpectAllClose(ForwardBackward(fused, in, {true, true, true}),
                     ForwardBackward(composite, in, {true, true, true}),
                     {"y", "dx", "dweight", "dbias"}, p.rtol, p.atol);
    }
  }
}

TEST(LayerNormTest, AddLayerNormGivesBothResultsAndTheirGradients) {
  for (const Precision& p : kPrecisions) {
    SCOPED_TRACE(Name(p));
    const std::vector<at::Tensor> in = {
        Random({4, 7, 29}, 4, p.dtype, kCpu), Random({4, 7, 29}, 5, p.dtype, kCpu),
        Random({29}, 6, p.dtype, kCpu).add(1), Random({29}, 7, p.dtype, kCpu)};
    auto fused = [](const std::vector<at::Tensor>& t) {
      AddNormResult r = AddLayerNorm(t[0], t[1], t[2], t[3], 1e-6);
      return std::vector<at::Tensor>{r.sum, r.normed};
    };
    auto composite = [](const std::vector<at::Tensor>& t) {
      AddNormResult r = AddLayerNormComposite(t[0], t[1], t[2], t[3], 1e-6);
      return std::vector<at::Tensor>{r.sum, r.normed};
    };
    const std::vector<std::string> names = {"sum", "normed", "dx", "dresidual", "dweight", "dbias"};
    ExpectAllClose(ForwardBackward(fused, in, {true, true, true, true}),
                   ForwardBackward(composite, in, {true, true, true, true}), names, p.rtol,
                   p.atol);
    // Only the normed result used: the sum's gradient is absent, not zero.
    auto normed_only = [&](bool use_fused) {
      return [use_fused](const std::vector<at::Tensor>& t) {
        AddNormResult r = use_fused ? AddLayerNorm(t[0], t[1], t[2], t[3], 1e-6)
                                    : AddLayerNormComposite(t[0], t[1], t[2], t[3], 1e-6);
        return std::vector<at::Tensor>{r.normed};
      };
    };
    ExpectAllClose(ForwardBackward(normed_only(true), in, {true, false, false, false}),
                   ForwardBackward(normed_only(false), in, {true, false, false, false}),
                   {"normed", "dx", "dresidual", "dweight", "dbias"}, p.rtol, p.atol);
  }
}

TEST(RmsNormTest, MatchesTheLlamaFormula) {
  for (const Precision& p : kPrecisions) {
    SCOPED_TRACE(Name(p));
    const std::vector<at::Tensor> in = {Random({2, 9, 33}, 8, p.dtype, kCpu),
                                        Random({33}, 9, p.dtype, kCpu).add(1)};
    auto fused = [](const std::vector<at::Tensor>& t) {
      return std::vector<at::Tensor>{RmsNorm(t[0], t[1], 1e-6)};
    };
    auto composite = [](const std::vector<at::Tensor>& t) {
      return std::vector<at::Tensor>{RmsNormComposite(t[0], t[1], 1e-6)};
    };
    ExpectAllClose(ForwardBackward(fused, in, {true, true}),
                   ForwardBackward(composite, in, {true, true}), {"y", "dx", "dweight"}, p.rtol,
                   p.atol);
  }
}

TEST(RmsNormTest, AddRmsNormAndAFloat32WeightOnBfloat16) {
  for (const Precision& p : kPrecisions) {
    SCOPED_TRACE(Name(p));
    const std::vector<at::Tensor> in = {Random({5, 31}, 10, p.dtype, kCpu),
                                        Random({5, 31}, 11, p.dtype, kCpu),
                                        Random({31}, 12, p.dtype, kCpu).add(1)};
    auto fused = [](const std::vector<at::Tensor>& t) {
      AddNormResult r = AddRmsNorm(t[0], t[1], t[2], 1e-5);
      return std::vector<at::Tensor>{r.sum, r.normed};
    };
    auto composite = [](const std::vector<at::Tensor>& t) {
      const at::Tensor h = t[0] + t[1];
      return std::vector<at::Tensor>{h, RmsNormComposite(h, t[2], 1e-5)};
    };
    ExpectAllClose(ForwardBackward(fused, in, {true, true, true}),
                   ForwardBackward(composite, in, {true, true, true}),
                   {"sum", "normed", "dx", "dresidual", "dweight"}, p.rtol, p.atol);
  }
  // A float32 weight on bfloat16 activations: the output is float32, as
  // the composite promotes it.
  const std::vector<at::Tensor> mixed = {Random({6, 17}, 13, at::kBFloat16, kCpu),
                                         Random({17}, 14, at::kFloat, kCpu).add(1)};
  auto fused = [](const std::vector<at::Tensor>& t) {
    return std::vector<at::Tensor>{RmsNorm(t[0], t[1], 1e-6)};
  };
  auto composite = [](const std::vector<at::Tensor>& t) {
    return std::vector<at::Tensor>{RmsNormComposite(t[0], t[1], 1e-6)};
  };
  ExpectAllClose(ForwardBackward(fused, mixed, {true, true}),
                 ForwardBackward(composite, mixed, {true, true}), {"y", "dx", "dweight"}, 2e-2,
                 2e-2);
}

TEST(LinearGeluTest, BothApproximationsWithAndWithoutBias) {
  for (const Precision& p : kPrecisions) {
    SCOPED_TRACE(Name(p));
    const at::Tensor x = Random({3, 7, 19}, 15, p.dtype, kCpu);
    const at::Tensor w = Random({23, 19}, 16, p.dtype, kCpu, 0.3);
    const at::Tensor b = Random({23}, 17, p.dtype, kCpu);
    for (const std::string approximate : {"tanh", "none"}) {
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(approximate + (with_bias ? " with bias" : " without bias"));
        const std::vector<at::Tensor> in = {x, w, with_bias ? b : at::Tensor()};
        auto fused = [approximate](const std::vector<at::Tensor>& t) {
          return std::vector<at::Tensor>{LinearGelu(t[0], t[1], t[2], approximate)};
        };
        auto composite = [approximate](const std::vector<at::Tensor>& t) {
          return std::vector<at::Tensor>{LinearGeluComposite(t[0], t[1], t[2], approximate)};
        };
        ExpectAllClose(ForwardBackward(fused, in, {true, true, true}),
                       ForwardBackward(composite, in, {true, true, true}),
                       {"y", "dx", "dweight", "dbias"}, p.rtol, p.atol);
        c10::NoGradGuard no_grad;
        EXPECT_TRUE(testing::AllClose(LinearGelu(x, w, in[2], approximate),
                                      LinearGeluComposite(x, w, in[2], approximate), p.rtol,
                                      p.atol))
            << "without gradients";
      }
    }
  }
  EXPECT_THROW(LinearGelu(at::ones({2, 3}), at::ones({4, 3}), at::Tensor(), "erf"), c10::Error);
}

TEST(SwigluTest, MatchesComposite) {
  for (const Precision& p : kPrecisions) {
    SCOPED_TRACE(Name(p));
    const std::vector<at::Tensor> in = {Random({3, 11, 41}, 18, p.dtype, kCpu, 2.0),
                                        Random({3, 11, 41}, 19, p.dtype, kCpu)};
    auto fused = [](const std::vector<at::Tensor>& t) {
      return std::vector<at::Tensor>{Swiglu(t[0], t[1])};
    };
    auto composite = [](const std::vector<at::Tensor>& t) {
      return std::vector<at::Tensor>{SwigluComposite(t[0], t[1])};
    };
    ExpectAllClose(ForwardBackward(fused, in, {true, true}),
                   ForwardBackward(composite, in, {true, true}), {"y", "dgate", "dup"}, p.rtol,
                   p.atol);
  }
  EXPECT_THROW(Swiglu(at::ones({2, 3}), at::ones({3, 2})), c10::Error);
}

// cos and sin tables as core/models/llama.cc's RotaryTables makes them.
std::pair<at::Tensor, at::Tensor> Tables(int64_t seq, int64_t dim, at::ScalarType dtype) {
  const at::Tensor inv_freq =
      at::pow(10000.0, -at::arange(0, dim, 2, at::kDouble) / static_cast<double>(dim));
  const at::Tensor freqs = at::arange(seq, at::kDouble).unsqueeze(1) * inv_freq.unsqueeze(0);
  const at::Tensor angles = at::cat({freqs, freqs}, -1);
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

TEST(RotaryTest, MatchesCompositeOnTransposedHeads) {
  for (const Precision& p : kPrecisions) {
    SCOPED_TRACE(Name(p));
    // x is [batch, seq, heads, dim] as a projection gives it; the rotary
    // sees it as [batch, heads, seq, dim]: a strided input.
    const at::Tensor x = Random({2, 13, 3, 10}, 20, p.dtype, kCpu);
    const auto [cos, sin] = Tables(13, 10, p.dtype);
    auto fused = [](const std::vector<at::Tensor>& t) {
      return std::vector<at::Tensor>{Rotary(t[0].transpose(1, 2), t[1], t[2])};
    };
    auto composite = [](const std::vector<at::Tensor>& t) {
      return std::vector<at::Tensor>{RotaryComposite(t[0].transpose(1, 2), t[1], t[2])};
    };
    const std::vector<at::Tensor> in = {x, cos, sin};
    ExpectAllClose(ForwardBackward(fused, in, {true, false, false}),
                   ForwardBackward(composite, in, {true, false, false}),
                   {"y", "dx", "dcos", "dsin"}, p.rtol, p.atol);
  }
}

TEST(RotaryTest, TablesThatRequireGradTakeTheComposite) {
  const at::Tensor x = Random({1, 2, 5, 8}, 21, at::kDouble, kCpu);
  const auto [cos, sin] = Tables(5, 8, at::kDouble);
  auto fused = [](const std::vector<at::Tensor>& t) {
    return std::vector<at::Tensor>{Rotary(t[0], t[1], t[2])};
  };
  auto composite = [](const std::vector<at::Tensor>& t) {
    return std::vector<at::Tensor>{RotaryComposite(t[0], t[1], t[2])};
  };
  ExpectAllClose(ForwardBackward(fused, {x, cos, sin}, {true, true, true}),
                 ForwardBackward(composite, {x, cos, sin}, {true, true, true}),
                 {"y", "dx", "dcos", "dsin"}, 1e-12, 1e-12);
}

struct CrossEntropyCase {
  std::vector<at::Tensor> inputs;  // x [2, 9, 16], weight [37, 16]
  at::Tensor targets;              // [2, 9], some -100
};

CrossEntropyCase CrossEntropyInputs(at::ScalarType dtype) {
  at::Tensor targets = at::arange(18, at::kLong).mul(7).remainder(37).view({2, 9});
  targets.index_put_({0, 3}, -100);
  targets.index_put_({1, 8}, -100);
  return {{Random({2, 9, 16}, 22, dtype, kCpu), Random({37, 16}, 23, dtype, kCpu, 0.5)}, targets};
}

TEST(LinearCrossEntropyTest, MatchesCompositeForEveryChunkSize) {
  for (const Precision& p : kPrecisions) {
    SCOPED_TRACE(Name(p));
    const CrossEntropyCase c = CrossEntropyInputs(p.dtype);
    auto composite = [&](const std::vector<at::Tensor>& t) {
      return std::vector<at::Tensor>{LinearCrossEntropyComposite(t[0], t[1], c.targets)};
    };
    const std::vector<at::Tensor> expected = ForwardBackward(composite, c.inputs, {true, true});
    // 18 rows: one row a chunk, chunks that do and do not divide 18, one
    // chunk, and the default.
    for (int64_t rows : {1, 4, 6, 7, 18, 100, 0}) {
      SCOPED_TRACE("chunk_rows " + std::to_string(rows));
      LinearCrossEntropyOptions o;
      o.chunk_rows = rows;
      auto fused = [&](const std::vector<at::Tensor>& t) {
        return std::vector<at::Tensor>{LinearCrossEntropy(t[0], t[1], c.targets, o)};
      };
      ExpectAllClose(ForwardBackward(fused, c.inputs, {true, true}), expected,
                     {"loss", "dx", "dweight"}, p.rtol, p.atol);
    }
  }
}

TEST(LinearCrossEntropyTest, IgnoreIndexFrozenWeightAndNoGrad) {
  const CrossEntropyCase c = CrossEntropyInputs(at::kDouble);
  // Another ignore_index: class 7 (a real class) is left out.
  LinearCrossEntropyOptions o;
  o.ignore_index = 7;
  o.chunk_rows = 5;
  auto fused = [&](const std::vector<at::Tensor>& t) {
    return std::vector<at::Tensor>{LinearCrossEntropy(t[0], t[1], c.targets.clamp_min(0), o)};
  };
  auto composite = [&](const std::vector<at::Tensor>& t) {
    return std::vector<at::Tensor>{
        LinearCrossEntropyComposite(t[0], t[1], c.targets.clamp_min(0), 7)};
  };
  ExpectAllClose(ForwardBackward(fused, c.inputs, {true, true}),
                 ForwardBackward(composite, c.inputs, {true, true}), {"loss", "dx", "dweight"},
                 1e-10, 1e-12);
  // A frozen head: only x's gradient.
  ExpectAllClose(ForwardBackward(fused, c.inputs, {true, false}),
                 ForwardBackward(composite, c.inputs, {true, false}), {"loss", "dx", "dweight"},
                 1e-10, 1e-12);
  {
    c10::NoGradGuard no_grad;
    EXPECT_TRUE(testing::AllClose(LinearCrossEntropy(c.inputs[0], c.inputs[1], c.targets),
                                  LinearCrossEntropyComposite(c.inputs[0], c.inputs[1], c.targets),
                                  1e-10, 1e-12));
  }
  // Every target ignored: 0 / 0, as PyTorch gives it.
  const at::Tensor none = at::full({2, 9}, -100, at::kLong);
  EXPECT_TRUE(std::isnan(LinearCrossEntropy(c.inputs[0], c.inputs[1], none).item<double>()));
  EXPECT_TRUE(
      std::isnan(LinearCrossEntropyComposite(c.inputs[0], c.inputs[1], none).item<double>()));
  // A target outside the vocabulary throws on the CPU.
  EXPECT_ANY_THROW(LinearCrossEntropy(c.inputs[0], c.inputs[1], c.targets.clamp_min(0) + 37));
  EXPECT_THROW(LinearCrossEntropy(c.inputs[0], c.inputs[1].t(), c.targets), c10::Error);
}

TEST(DispatchTest, TheCpuTakesTheComposite) {
  EXPECT_FALSE(RunsCudaKernel(at::ones({2}, at::kFloat)));
  EXPECT_FALSE(RunsCudaKernel(at::Tensor()));
}

}  // namespace
}  // namespace kernels
}  // namespace fsdp2
