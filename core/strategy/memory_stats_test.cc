// Tests of core/strategy/memory_stats.h: the optimizer's state bytes, counted
// by LibTorch's state types and, for any other type, through serialization;
// the process's resident memory and its reset.
#include "core/strategy/memory_stats.h"

#include <gtest/gtest.h>
#include <torch/optim.h>
#include <torch/serialize/archive.h>

#include <memory>
#include <vector>

namespace fsdp2 {
namespace strategy {
namespace {

// Two float32 parameters of 12 and 5 elements and one float64 of 3.
std::vector<at::Tensor> Params() {
  return {at::randn({3, 4}).requires_grad_(), at::randn({5}).requires_grad_(),
          at::randn({3}, at::kDouble).requires_grad_()};
}
constexpr int64_t kParamBytes = 12 * 4 + 5 * 4 + 3 * 8;

void Step(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params) {
  optimizer.zero_grad(/*set_to_none=*/false);
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (const auto& p : params) loss = loss + p.to(at::kDouble).pow(2).sum();
  loss.backward();
  optimizer.step();
}

TEST(OptimizerStateBytes, AdamWHoldsTwoMomentsPerParameterAfterAStep) {
  auto params = Params();
  torch::optim::AdamW adamw(params);
  EXPECT_EQ(OptimizerStateBytes(adamw), 0);  // state is created by the first step
  Step(adamw, params);
  EXPECT_EQ(OptimizerStateBytes(adamw), 2 * kParamBytes);
  Step(adamw, params);
  EXPECT_EQ(OptimizerStateBytes(adamw), 2 * kParamBytes);
}

TEST(OptimizerStateBytes, AmsgradAddsAThirdMoment) {
  auto params = Params();
  torch::optim::Adam adam(params, torch::optim::AdamOptions().amsgrad(true));
  Step(adam, params);
  EXPECT_EQ(OptimizerStateBytes(adam), 3 * kParamBytes);
}

TEST(OptimizerStateBytes, SgdHoldsAMomentumBufferOnlyWithMomentum) {
  auto params = Params();
  torch::optim::SGD plain(params, torch::optim::SGDOptions(0.1));
  Step(plain, params);
  EXPECT_EQ(OptimizerStateBytes(plain), 0);
  torch::optim::SGD momentum(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  Step(momentum, params);
  EXPECT_EQ(OptimizerStateBytes(momentum), kParamBytes);
}

TEST(OptimizerStateBytes, AdagradAndRmsprop) {
  auto params = Params();
  torch::optim::Adagrad adagrad(params);
  Step(adagrad, params);
  EXPECT_EQ(OptimizerStateBytes(adagrad), kParamBytes);  // sum (created at construction)
  torch::optim::RMSprop rmsprop(params, torch::optim::RMSpropOptions().momentum(0.9));
  Step(rmsprop, params);
  EXPECT_EQ(OptimizerStateBytes(rmsprop), 2 * kParamBytes);  // square_avg, momentum
}

// A user's state type: counted through what it serializes.
struct TwoBuffersState
    : public torch::optim::OptimizerCloneableParamState<TwoBuffersState> {
  at::Tensor a, b;
  void serialize(torch::serialize::OutputArchive& archive) const override {
    archive.write("a", a, /*is_buffer=*/true);
    archive.write("b", b, /*is_buffer=*/true);
  }
  void serialize(torch::serialize::InputArchive&) override {}
};

class TwoBuffers : public torch::optim::Optimizer {
 public:
  explicit TwoBuffers(std::vector<at::Tensor> params)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  at::Tensor step(LossClosure) override {
    for (const auto& p : param_groups()[0].params()) {
      auto s = std::make_unique<TwoBuffersState>();
      s->a = at::zeros_like(p);
      s->b = at::zeros({7}, at::kDouble);
      state()[p.unsafeGetTensorImpl()] = std::move(s);
    }
    return {};
  }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
};

TEST(OptimizerStateBytes, AnotherStateTypeCountsTheTensorsItSerializes) {
  auto params = Params();
  TwoBuffers optimizer(params);
  EXPECT_EQ(OptimizerStateBytes(optimizer), 0);
  optimizer.step(nullptr);
  EXPECT_EQ(OptimizerStateBytes(optimizer), kParamBytes + 3 * 7 * 8);
}

TEST(ResidentMemory, PeakCoversNowAndGrowsWithATouchedBuffer) {
  const ResidentMemory before = ProcessResidentMemory();
  EXPECT_GT(before.rss_bytes, 0);
  EXPECT_GE(before.peak_rss_bytes, before.rss_bytes);
  {
    // 256 MiB, written so that it is resident.
    at::Tensor big = at::ones({64 * 1024 * 1024}, at::kFloat);
    const ResidentMemory during = ProcessResidentMemory();
    EXPECT_GE(during.rss_bytes, before.rss_bytes + 200 * 1024 * 1024);
    EXPECT_GE(during.peak_rss_bytes, during.rss_bytes);
  }
  const ResidentMemory after = ProcessResidentMemory();
  EXPECT_GE(after.peak_rss_bytes, before.rss_bytes + 200 * 1024 * 1024);
  // The reset brings the peak back to about what is resident now.
  ResetPeakResidentBytes();
  const ResidentMemory reset = ProcessResidentMemory();
  EXPECT_GE(reset.peak_rss_bytes, reset.rss_bytes);
  EXPECT_LT(reset.peak_rss_bytes, after.peak_rss_bytes);
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
