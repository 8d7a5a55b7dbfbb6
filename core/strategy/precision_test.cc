// The CPU check behind parallelize()'s warning that bf16/fp16 compute would
// run emulated.
#include <gtest/gtest.h>

#include "core/strategy/fsdp2_strategy.h"

namespace fsdp2 {
namespace strategy {
namespace {

TEST(LowPrecision, NativeOnlyWithTheMatchingInstructions) {
  const std::string avx2 = " fpu sse2 avx avx2 fma ";
  const std::string avx512 = " avx2 avx512f avx512bw avx512vl ";
  const std::string avx512_bf16 = " avx2 avx512f avx512bw avx512_bf16 ";
  const std::string amx = " avx2 avx512f amx_bf16 amx_tile amx_fp16 ";
  EXPECT_TRUE(LowPrecisionIsEmulated(at::kBFloat16, avx2));
  EXPECT_TRUE(LowPrecisionIsEmulated(at::kBFloat16, avx512));
  EXPECT_FALSE(LowPrecisionIsEmulated(at::kBFloat16, avx512_bf16));
  EXPECT_FALSE(LowPrecisionIsEmulated(at::kBFloat16, amx));
  EXPECT_TRUE(LowPrecisionIsEmulated(at::kHalf, avx512_bf16));
  EXPECT_FALSE(LowPrecisionIsEmulated(at::kHalf, amx));
  // A flag must match whole: avx512_bf16x is not avx512_bf16.
  EXPECT_TRUE(LowPrecisionIsEmulated(at::kBFloat16, " avx512_bf16x "));
}

TEST(LowPrecision, Fp32AndUnknownCpusNeverWarn) {
  EXPECT_FALSE(LowPrecisionIsEmulated(at::kFloat, " avx2 "));
  EXPECT_FALSE(LowPrecisionIsEmulated(at::kDouble, " avx2 "));
  EXPECT_FALSE(LowPrecisionIsEmulated(at::kBFloat16, " "));
  EXPECT_FALSE(LowPrecisionIsEmulated(at::kBFloat16, ""));
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
