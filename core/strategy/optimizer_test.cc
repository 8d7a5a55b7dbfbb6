#include "core/strategy/optimizer.h"

#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

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
