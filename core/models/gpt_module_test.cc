#include "core/models/gpt_module.h"

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace fsdp2 {
namespace models {
namespace {

GPTConfig Small() {
  GPTConfig c;
  c.vocab_size = 16;
  c.block_size = 4;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

strategy::Batch Tokens() {
  at::Tensor t = at::randint(16, {3, 5}, at::TensorOptions().dtype(at::kLong));
  return {t.narrow(1, 0, 4), t.narrow(1, 1, 4)};
}

TEST(GPTModule, StepsAreTheNextTokenLossAndPredictionsTheArgmax) {
  torch::manual_seed(1);
  GPTModule module(Small());
  const auto batch = Tokens();
  const at::Tensor logits = module.gpt()->forward(batch[0]);
  const at::Tensor want = LanguageModelLoss(logits, batch[1]);
  EXPECT_TRUE(at::equal(module.training_step(batch, 0), want));
  // The model's own loss is the same ops on the CPU (fused only on a GPU).
  EXPECT_TRUE(at::equal(module.gpt()->forward(batch[0], batch[1]), want));
  EXPECT_TRUE(at::equal(module.validation_step(batch, 0), want));
  EXPECT_TRUE(at::equal(module.predict_step({batch[0]}, 0), logits.argmax(-1)));
  // Narrower integer tokens train alike.
  EXPECT_TRUE(at::equal(module.loss({batch[0].to(at::kInt), batch[1].to(at::kByte)}), want));
}

TEST(GPTModule, SameSeedSameParametersAndDtypeConversion) {
  torch::manual_seed(3);
  GPTModule a(Small());
  torch::manual_seed(3);
  GPTModule b(Small(), {}, at::kDouble);
  auto pa = a.module()->parameters(), pb = b.module()->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pb[i].scalar_type(), at::kDouble);
    EXPECT_TRUE(at::equal(pa[i].to(at::kDouble), pb[i]));
  }
}

TEST(GPTModule, OptimizerFromItsOptions) {
  strategy::OptimizerOptions o = GPT2AdamW(3e-3);
  GPTModule adamw(Small(), o);
  auto opt = adamw.configure_optimizers();
  auto* a = dynamic_cast<torch::optim::AdamW*>(opt.get());
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->param_groups()[0].params().size(), adamw.module()->parameters().size());
  const auto& g = static_cast<torch::optim::AdamWOptions&>(a->param_groups()[0].options());
  EXPECT_EQ(g.lr(), 3e-3);
  EXPECT_EQ(std::get<0>(g.betas()), 0.9);
  EXPECT_EQ(std::get<1>(g.betas()), 0.95);
  EXPECT_EQ(g.eps(), 1e-8);
  EXPECT_EQ(g.weight_decay(), 0.1);
  o.kind = strategy::OptimizerKind::kSGD;
  GPTModule sgd(Small(), o);
  EXPECT_NE(dynamic_cast<torch::optim::SGD*>(sgd.configure_optimizers().get()), nullptr);
}

TEST(GPTModule, ABatchWithoutTargetsIsAnError) {
  GPTModule module(Small());
  EXPECT_THROW(module.training_step({Tokens()[0]}, 0), std::invalid_argument);
  EXPECT_THROW(GPTModule(GPTConfig{16, 4, 1, 3, 8}), std::invalid_argument);
}

}  // namespace
}  // namespace models
}  // namespace fsdp2
