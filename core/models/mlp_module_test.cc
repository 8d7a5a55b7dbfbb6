#include "core/models/mlp_module.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

namespace fsdp2 {
namespace models {
namespace {

namespace F = torch::nn::functional;

MLPConfig Small() {
  MLPConfig c;
  c.in_features = 4;
  c.hidden = 8;
  c.out_features = 3;
  c.depth = 2;
  return c;
}

TEST(MLPModule, MeanSquaredErrorForValuesCrossEntropyForClasses) {
  torch::manual_seed(2);
  MLPModule module(Small());
  const at::Tensor x = at::randn({5, 4});
  const at::Tensor out = module.mlp()->forward(x);
  const at::Tensor values = at::randn({5, 3});
  const at::Tensor classes = at::randint(3, {5}, at::TensorOptions().dtype(at::kLong));
  EXPECT_TRUE(at::equal(module.training_step({x, values}, 0), F::mse_loss(out, values)));
  EXPECT_TRUE(at::equal(module.validation_step({x, classes}, 0), F::cross_entropy(out, classes)));
  EXPECT_TRUE(at::equal(module.predict_step({x}, 0), out));
}

TEST(MLPModule, TargetsOfTheWrongShapeSayWhatIsExpected) {
  MLPModule module(Small(), {}, at::kDouble);
  const at::Tensor x = at::randn({5, 4}, at::kDouble);
  try {
    module.loss({x, at::randn({5, 2}, at::kDouble)});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the output's shape [5, 3]"), std::string::npos)
        << e.what();
  }
  try {
    module.loss({x, at::zeros({5, 1}, at::kLong)});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("class targets must be [B] = [5]"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace models
}  // namespace fsdp2
