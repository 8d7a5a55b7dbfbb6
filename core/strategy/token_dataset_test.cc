// MapTokenWindows and TokenLoader on small token files: windows, fractions,
// uint16 tokens above 32767, and the error codes of bad files.
#include "core/strategy/token_dataset.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/common/error.h"

namespace fsdp2 {
namespace strategy {
namespace {

template <typename T>
std::string WriteTokens(const std::string& name, const std::vector<T>& tokens) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            (name + "_" + std::to_string(::getpid()) + ".bin"))
                               .string();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(T));
  return path;
}

TEST(TokenDatasetTest, WindowsOfBlockSizePlusOneOverTheChosenFraction) {
  std::vector<uint8_t> tokens(50);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint8_t>(i);
  const std::string path = WriteTokens("fsdp2_tokens_u8", tokens);
  TokenDatasetOptions o;
  o.block_size = 4;  // windows of 5 tokens: 10 of them
  at::Tensor all = MapTokenWindows(path, o);
  ASSERT_EQ(all.sizes(), at::IntArrayRef({10, 5}));
  EXPECT_EQ(all[3][0].item<int64_t>(), 15);
  o.begin_fraction = 0.8;  // the last two windows
  at::Tensor tail = MapTokenWindows(path, o);
  ASSERT_EQ(tail.size(0), 2);
  EXPECT_EQ(tail[0][0].item<int64_t>(), 40);
  std::filesystem::remove(path);
}

TEST(TokenDatasetTest, LoaderGivesShiftedInt64InputsAndTargets) {
  std::vector<uint16_t> tokens(12);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(60000 + i);
  const std::string path = WriteTokens("fsdp2_tokens_u16", tokens);
  TokenDatasetOptions o;
  o.token_type = TokenType::kUInt16;
  o.block_size = 2;  // 4 windows of 3 tokens
  DistributedSamplerOptions so;
  so.global_batch_size = 2;
  so.shuffle = false;
  at::Tensor windows = MapTokenWindows(path, o);
  TokenLoader loader(DataLoader({windows}, DistributedSampler(windows.size(0), 0, 1, so)),
                     o.token_type, o.block_size);
  ASSERT_EQ(loader.num_batches(), 2);
  const Batch b = loader.batch(1);  // windows 2 and 3
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].scalar_type(), at::kLong);
  EXPECT_TRUE(b[0].equal(at::tensor({60006, 60007, 60009, 60010}, at::kLong).view({2, 2})));
  EXPECT_TRUE(b[1].equal(at::tensor({60007, 60008, 60010, 60011}, at::kLong).view({2, 2})));
  try {
    loader.batch(2);
    FAIL() << "batch 2 of 2";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  std::filesystem::remove(path);
}

TEST(TokenDatasetTest, BadFilesSayWhatIsWrong) {
  TokenDatasetOptions o;
  try {
    MapTokenWindows("/nonexistent/tokens.bin", o);
    FAIL() << "a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
  o.token_type = TokenType::kInt32;
  const std::string path = WriteTokens("fsdp2_tokens_odd", std::vector<uint8_t>(10));
  try {
    MapTokenWindows(path, o);  // 10 bytes are not whole int32 tokens
    FAIL() << "a file of 10 bytes read as int32";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("multiple of the token size 4"), std::string::npos);
  }
  o.end_fraction = 1.5;
  EXPECT_THROW(MapTokenWindows(path, o), InvalidArgumentError);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
