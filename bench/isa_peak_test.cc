// The probe measures exactly what the CPU flags allow, and never runs an
// instruction the flags do not name (a missing flag would be SIGILL).
#include "bench/isa_peak.h"

#include <gtest/gtest.h>

#include <string>

#include "core/launch/local_launcher.h"

namespace fsdp2 {
namespace bench {
namespace {

TEST(IsaPeak, MeasuresWhatThisCpuHas) {
  const std::string flags = launch::CpuFlags();
  auto has = [&](const char* flag) { return launch::HasCpuFlag(flags, flag); };
  const IsaPeak peak = MeasureIsaPeak(flags);
  if (has("avx512f")) {
    EXPECT_EQ(peak.fp32_isa, "avx512f");
  } else if (has("avx2") && has("fma")) {
    EXPECT_EQ(peak.fp32_isa, "avx2");
  } else {
    EXPECT_EQ(peak.fp32_isa, "");
  }
  if (!peak.fp32_isa.empty()) {
    EXPECT_GT(peak.fp32_gflops, 0);
  }
  const bool bf16 = has("avx512f") && has("avx512_bf16");
  EXPECT_EQ(peak.bf16_gflops > 0, bf16);
  const std::string text = DescribeIsaPeak(peak);
  EXPECT_NE(text.find(bf16 ? "bf16 / fp32" : "fp32"), std::string::npos) << text;
}

TEST(IsaPeak, SaysWhereAmxIsNotMeasured) {
  const IsaPeak peak = MeasureIsaPeak("amx_bf16 amx_tile");
  EXPECT_TRUE(peak.amx);
  EXPECT_EQ(peak.fp32_isa, "");
  EXPECT_NE(DescribeIsaPeak(peak).find("AMX present, not measured"), std::string::npos);
  EXPECT_FALSE(MeasureIsaPeak("").amx);
  EXPECT_EQ(DescribeIsaPeak(MeasureIsaPeak("")).find("AMX"), std::string::npos);
}

TEST(IsaPeak, FlagsNarrowWhatIsRun) {
  EXPECT_EQ(MeasureIsaPeak("").fp32_isa, "");
  EXPECT_NE(DescribeIsaPeak(MeasureIsaPeak("")).find("not measured"),
            std::string::npos);
  const std::string flags = launch::CpuFlags();
  auto has = [&](const char* flag) { return launch::HasCpuFlag(flags, flag); };
  if (!has("avx2") || !has("fma")) GTEST_SKIP() << "no AVX2 here";
  // AVX-512 left out: the AVX2 loop runs, and no bf16 loop.
  const IsaPeak peak = MeasureIsaPeak("fma avx2 avx512_bf16");
  EXPECT_EQ(peak.fp32_isa, "avx2");
  EXPECT_GT(peak.fp32_gflops, 0);
  EXPECT_EQ(peak.bf16_gflops, 0);
  EXPECT_NE(DescribeIsaPeak(peak).find("no AVX512-BF16"), std::string::npos);
}

}  // namespace
}  // namespace bench
}  // namespace fsdp2
