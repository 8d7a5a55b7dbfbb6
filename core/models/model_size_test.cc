// What a configuration's parameters need, computed before building: the
// counts equal the models' own parameters, and a configuration too large
// for the memory given is refused with the field that makes it so and the
// bytes it needs.
#include "core/models/model_size.h"

#include <gtest/gtest.h>

#include <string>

#include "core/common/error.h"
#include "core/models/llama.h"

namespace fsdp2 {
namespace models {
namespace {

// Parameter elements and tensors of a built model, each tensor once.
std::pair<double, double> Count(torch::nn::Module& m) {
  double elements = 0, tensors = 0;
  for (const at::Tensor& p : m.parameters()) {
    elements += static_cast<double>(p.numel());
    ++tensors;
  }
  return {elements, tensors};
}

TEST(ModelSize, FootprintsCountTheBuiltModelsParameters) {
  GPTConfig gpt;
  gpt.vocab_size = 40;
  gpt.block_size = 12;
  gpt.n_layer = 3;
  gpt.n_head = 2;
  gpt.n_embd = 8;
  GPT built_gpt(gpt);
  const ParameterFootprint g = GptFootprint(gpt);
  EXPECT_EQ(std::make_pair(g.elements, g.tensors), Count(*built_gpt));
  EXPECT_EQ(g.elements, static_cast<double>(gpt.NumParams()));
  EXPECT_EQ(g.element_bytes, 4);

  MLPConfig mlp;
  mlp.in_features = 5;
  mlp.hidden = 6;
  mlp.out_features = 3;
  mlp.depth = 4;
  MLP built_mlp(mlp);
  const ParameterFootprint m = MlpFootprint(mlp);
  EXPECT_EQ(std::make_pair(m.elements, m.tensors), Count(*built_mlp));

  // Biases in q, k, v (qwen2), untied head, head_dim * heads != hidden.
  for (const char* extra : {R"("tie_word_embeddings": false)", R"("tie_word_embeddings": true)"}) {
    const HfLlamaConfig hf = ParseHfConfig(
        std::string(R"({"model_type": "qwen2", "vocab_size": 40, "hidden_size": 24,
          "intermediate_size": 36, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 8, )") + extra + "}",
        "config.json");
    LlamaForCausalLM built_hf(hf);
    const ParameterFootprint h = LlamaFootprint(hf, at::kFloat);
    EXPECT_EQ(std::make_pair(h.elements, h.tensors), Count(*built_hf)) << extra;
    EXPECT_EQ(LlamaFootprint(hf, at::kBFloat16).element_bytes, 4) << "built in float32 first";
    EXPECT_EQ(LlamaFootprint(hf, at::kDouble).element_bytes, 8);
  }
}

// The message of RequireFits, or "" when it does not throw.
template <typename... Args>
std::string Refusal(const Args&... args) {
  try {
    RequireFits(args...);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(ModelSize, ATooLargeConfigurationNamesItsFieldAndBytes) {
  const int64_t memory = 24'000'000'000;  // 24 GB
  GPTConfig gpt;
  EXPECT_EQ(Refusal("model \"gpt\"", gpt, 1, memory), "");
  gpt.n_layer = 1'000'000'000;
  const std::string deep = Refusal("model \"gpt\"", gpt, 1, memory);
  EXPECT_NE(deep.find("model \"gpt\": \"n_layer\" = 1000000000 makes 5e+13 parameters"),
            std::string::npos)
      << deep;
  EXPECT_NE(deep.find("(200 TB in float32)"), std::string::npos) << deep;
  EXPECT_NE(deep.find("more than the 24 GB of memory"), std::string::npos) << deep;
  gpt.n_layer = 2;
  gpt.vocab_size = 1'000'000'000'000;
  EXPECT_NE(Refusal("model \"gpt\"", gpt, 1, memory).find("\"vocab_size\" = 1000000000000"),
            std::string::npos);

  MLPConfig mlp;
  mlp.depth = 1'000'000'000;
  const std::string mlp_deep = Refusal("model \"mlp\"", mlp, 1, memory);
  EXPECT_NE(mlp_deep.find("\"depth\" = 1000000000"), std::string::npos) << mlp_deep;
  EXPECT_NE(mlp_deep.find("make \"depth\" smaller"), std::string::npos) << mlp_deep;

  // Many tiny layers are refused too: each tensor's objects count.
  mlp = MLPConfig();
  mlp.hidden = 1;
  mlp.depth = 10'000'000;  // 6e7 tensors of a few elements each
  EXPECT_NE(Refusal("model \"mlp\"", mlp, 1, memory).find("\"depth\""), std::string::npos);

  // A deferred build keeps 1/shards of the elements on each rank.
  gpt = GPTConfig();
  gpt.n_embd = 4096;
  gpt.n_head = 32;
  gpt.n_layer = 200;  // 4e10 parameters, 161 GB
  EXPECT_NE(Refusal("model \"gpt\"", gpt, 1, memory).find("\"n_embd\" = 4096 makes"),
            std::string::npos);
  EXPECT_EQ(Refusal("model \"gpt\"", gpt, 8, memory), "");
  const std::string four = Refusal("model \"gpt\"", gpt, 4, memory);
  EXPECT_NE(four.find("on each of 4 ranks"), std::string::npos) << four;
}

TEST(ModelSize, MachineMemoryAndBytes) {
  EXPECT_GT(MachineMemoryBytes(), int64_t{1} << 26);
  EXPECT_EQ(FormatBytes(100), "100 B");
  EXPECT_EQ(FormatBytes(13.25e12), "13.2 TB");
  EXPECT_EQ(FormatBytes(512e6), "512 MB");
}

}  // namespace
}  // namespace models
}  // namespace fsdp2
