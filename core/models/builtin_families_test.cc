// The model families built from JSON, used from C++ as the C ABI uses
// them: the configuration's errors name the key, a batch is checked before
// the model runs (what is wrong and what was expected), predictions have
// the shape PredictShape says.
#include "core/models/builtin_families.h"

#include <gtest/gtest.h>

#include <string>

#include "core/common/error.h"

namespace fsdp2 {
namespace models {
namespace {

// Runs `fn` and expects an E whose message contains `needle`.
template <typename E, typename F>
void ExpectThrows(F&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "did not throw; expected '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

constexpr char kGpt[] =
    R"({"family": "gpt", "vocab_size": 32, "block_size": 8, "n_layer": 2, "n_head": 2,
        "n_embd": 16})";

at::Tensor Tokens(int64_t rows, int64_t cols, int64_t high) {
  return at::randint(high, {rows, cols}, at::TensorOptions().dtype(at::kLong));
}

TEST(BuiltinFamilies, GptTrainsAndPredictsLogits) {
  torch::manual_seed(3);
  auto gpt = CreateModelFamily(kGpt);
  EXPECT_EQ(gpt->family(), "gpt");
  const strategy::Batch batch = {Tokens(3, 8, 32), Tokens(3, 8, 32)};
  gpt->CheckBatch(batch);
  const at::Tensor loss = gpt->training_step(batch, 0);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_TRUE(loss.requires_grad());
  EXPECT_EQ(gpt->PredictShape(batch), (std::vector<int64_t>{3, 8, 32}));
  const at::Tensor logits = gpt->predict_step(batch, 0);
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{3, 8, 32}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  auto optimizer = gpt->configure_optimizers();
  EXPECT_EQ(optimizer->param_groups().size(), 1u);
}

TEST(BuiltinFamilies, BadBatchesSayWhatIsExpected) {
  auto gpt = CreateModelFamily(kGpt);
  ExpectThrows<ShapeError>([&] { gpt->CheckBatch({Tokens(2, 8, 32)}); }, "this model needs");
  ExpectThrows<ShapeError>([&] { gpt->CheckBatch({Tokens(2, 9, 32), Tokens(2, 9, 32)}); },
                           "block_size = 8");
  ExpectThrows<InvalidArgumentError>(
      [&] { gpt->CheckBatch({Tokens(2, 8, 32) + 32, Tokens(2, 8, 32)}); },
      "outside the vocabulary [0, 32)");
  auto mlp = CreateModelFamily(
      R"({"family": "mlp", "in_features": 3, "hidden": 4, "out_features": 2, "depth": 1})");
  EXPECT_EQ(mlp->family(), "mlp");
  ExpectThrows<ShapeError>([&] { mlp->CheckBatch({at::randn({5, 4}), at::randn({5, 2})}); },
                           "x must be a floating-point [B, 3] tensor");
  ExpectThrows<ShapeError>([&] { mlp->CheckBatch({at::randn({5, 3}), at::randn({5, 3})}); },
                           "the output's shape [5, 2]");
  mlp->CheckBatch({at::randn({5, 3}, at::kDouble), at::randint(2, {5}, at::kLong)});
  EXPECT_EQ(mlp->PredictShape({at::randn({5, 3})}), (std::vector<int64_t>{5, 2}));
}

TEST(BuiltinFamilies, ConfigurationErrorsNameTheKey) {
  ExpectThrows<InvalidArgumentError>([] { CreateModelFamily("{\"family\": \"gpt\""); },
                                     "not valid JSON");
  ExpectThrows<InvalidArgumentError>([] { CreateModelFamily(R"({"family": "rnn"})"); },
                                     "unknown model family \"rnn\"");
  ExpectThrows<InvalidArgumentError>(
      [] { CreateModelFamily(R"({"family": "gpt", "layers": 2})"); }, "unknown key \"layers\"");
  ExpectThrows<InvalidArgumentError>(
      [] { CreateModelFamily(R"({"family": "mlp", "depth": 0})"); },
      "\"depth\" must be a positive integer");
  ExpectThrows<InvalidArgumentError>(
      [] { CreateModelFamily(R"({"family": "hf", "dtype": "float32"})"); }, "needs \"path\"");
}

}  // namespace
}  // namespace models
}  // namespace fsdp2
