#include "core/strategy/optimizer.h"
#include "core/strategy/fused_adamw.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>

namespace fsdp2 {
namespace strategy {
namespace {

std::vector<at::Tensor> Params() { return {at::zeros({3}, at::requires_grad())}; }

TEST(MakeOptimizer, AdamWTakesEveryHyperParameter) {
  OptimizerOptions o;
  o.lr = 3e-3;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  auto opt = MakeOptimizer(Params(), o);
  auto* adamw = dynamic_cast<torch::optim::AdamW*>(opt.get());
  ASSERT_NE(adamw, nullptr);
  const auto& g = static_cast<torch::optim::AdamWOptions&>(adamw->param_groups()[0].options());
  EXPECT_EQ(g.lr(), 3e-3);
  EXPECT_EQ(std::get<0>(g.betas()), 0.8);
  EXPECT_EQ(std::get<1>(g.betas()), 0.95);
  EXPECT_EQ(g.eps(), 1e-6);
  EXPECT_EQ(g.weight_decay(), 0.1);
}

// FusedAdamW against LibTorch's AdamW on the same parameters and gradients:
// bit-identical parameters and moments after every step, for float and
// double, sizes that are not multiples of a vector, with and without weight
// decay, and a parameter that has no gradient in some steps.
template <typename Optimizer>
std::vector<at::Tensor> Train(at::ScalarType type, double weight_decay,
                              std::vector<std::vector<at::Tensor>>* states) {
  auto gen = at::detail::createCPUGenerator(7);
  std::vector<at::Tensor> params;
  for (int64_t n : {1, 15, 16, 17, 1000, 70001}) {
    params.push_back(at::randn({n}, gen, at::TensorOptions(type)).requires_grad_());
  }
  Optimizer opt(params, torch::optim::AdamWOptions(3e-3)
                            .betas({0.8, 0.95})
                            .eps(1e-6)
                            .weight_decay(weight_decay));
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (i == 2 && step % 2 == 1) {
        params[i].mutable_grad() = at::Tensor();  // no gradient this step
        continue;
      }
      params[i].mutable_grad() = at::randn(params[i].sizes(), gen, params[i].options());
    }
    opt.step();
  }
  for (const auto& p : params) {
    const auto& state = static_cast<torch::optim::AdamWParamState&>(
        *opt.state().at(p.unsafeGetTensorImpl()));
    states->push_back({state.exp_avg(), state.exp_avg_sq(),
                       at::scalar_tensor(static_cast<double>(state.step()))});
  }
  return params;
}

TEST(FusedAdamW, EqualsLibTorchsAdamWBitForBit) {
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    for (double weight_decay : {0.0, 0.1}) {
      std::vector<std::vector<at::Tensor>> fused_states, plain_states;
      const auto fused = Train<FusedAdamW>(type, weight_decay, &fused_states);
      const auto plain = Train<torch::optim::AdamW>(type, weight_decay, &plain_states);
      for (size_t i = 0; i < plain.size(); ++i) {
        const std::string which = std::string(c10::toString(type)) + " wd " +
                                  std::to_string(weight_decay) + " param " + std::to_string(i);
        EXPECT_TRUE(at::equal(fused[i], plain[i]))
            << which << ": max difference "
            << (fused[i] - plain[i]).abs().max().item<double>();
        for (size_t k = 0; k < plain_states[i].size(); ++k) {
          EXPECT_TRUE(at::equal(fused_states[i][k], plain_states[i][k])) << which << " state " << k;
        }
      }
    }
  }
}

// Steps FusedAdamW on `start` and LibTorch's AdamW on a copy (its layout
// kept) with the same gradients, `edit` applied to both after the first
// step; whether the parameters end bit-identical.
bool SameAsLibTorch(const at::Tensor& start, const torch::optim::AdamWOptions& options,
                    const std::function<void(torch::optim::Optimizer&)>& edit = nullptr) {
  at::Tensor a = start.detach().clone().requires_grad_();
  at::Tensor b = start.detach().clone().requires_grad_();
  FusedAdamW fused({a}, options);
  torch::optim::AdamW reference({b}, options);
  for (int step = 0; step < 3; ++step) {
    at::Tensor g = at::randn(start.sizes());
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    fused.step();
    reference.step();
    if (step == 0 && edit) {
      edit(fused);
      edit(reference);
    }
  }
  return at::equal(a, b);
}

TEST(FusedAdamW, AmsgradAndOtherLayoutsTakeLibTorchsStep) {
  const auto options = torch::optim::AdamWOptions(1e-2);
  at::Tensor strided = at::randn({4, 6}).t();
  ASSERT_FALSE(strided.detach().clone().is_contiguous());
  EXPECT_TRUE(SameAsLibTorch(strided, options)) << "a non-contiguous parameter";
  // A state in another layout (as a loaded one may be).
  EXPECT_TRUE(SameAsLibTorch(at::randn({4, 6}), options, [](torch::optim::Optimizer& opt) {
    auto& state = static_cast<torch::optim::AdamWParamState&>(*opt.state().begin()->second);
    state.exp_avg(state.exp_avg().t().contiguous().t());  // same values, transposed
  })) << "a transposed state";
  EXPECT_TRUE(SameAsLibTorch(at::randn({5}), torch::optim::AdamWOptions(1e-2).amsgrad(true)))
      << "amsgrad";
}

TEST(MakeOptimizer, AdamWIsTheFusedOne) {
  auto opt = MakeOptimizer(Params(), OptimizerOptions());
  EXPECT_NE(dynamic_cast<FusedAdamW*>(opt.get()), nullptr);
}

TEST(MakeOptimizer, DefaultsAreTheCApis) {
  // fsdp2_optimizer_options_init: AdamW, lr 1e-3, betas (0.9, 0.999), eps
  // 1e-8, weight decay 0.01, momentum 0.
  const OptimizerOptions o;
  EXPECT_EQ(o.kind, OptimizerKind::kAdamW);
  EXPECT_EQ(o.lr, 1e-3);
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.999);
  EXPECT_EQ(o.eps, 1e-8);
  EXPECT_EQ(o.weight_decay, 0.01);
  EXPECT_EQ(o.momentum, 0);
}

TEST(MakeOptimizer, AdamAndSgd) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.weight_decay = 0;
  auto adam = MakeOptimizer(Params(), o);
  ASSERT_NE(dynamic_cast<torch::optim::Adam*>(adam.get()), nullptr);
  EXPECT_EQ(static_cast<torch::optim::AdamOptions&>(adam->param_groups()[0].options())
                .weight_decay(),
            0);
  o.kind = OptimizerKind::kSGD;
  o.lr = 0.1;
  o.momentum = 0.9;
  auto sgd = MakeOptimizer(Params(), o);
  auto* s = dynamic_cast<torch::optim::SGD*>(sgd.get());
  ASSERT_NE(s, nullptr);
  const auto& g = static_cast<torch::optim::SGDOptions&>(s->param_groups()[0].options());
  EXPECT_EQ(g.lr(), 0.1);
  EXPECT_EQ(g.momentum(), 0.9);
}

TEST(ParseOptimizerKind, NamesRoundTripAndUnknownNamesSayTheChoices) {
  for (auto kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSGD}) {
    EXPECT_EQ(ParseOptimizerKind(ToString(kind)), kind);
  }
  try {
    ParseOptimizerKind("lamb");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("known: adamw, adam, sgd"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
