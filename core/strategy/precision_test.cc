// The CPU check behind parallelize()'s warning that bf16/fp16 compute would
// be slower than fp32: emulated, or (bf16 on Intel without AMX) no faster.
#include <gtest/gtest.h>

#include "core/launch/local_launcher.h"
#include "core/strategy/fsdp2_strategy.h"

namespace fsdp2 {
namespace strategy {
namespace {

constexpr const char* kIntel = "GenuineIntel";
constexpr const char* kAmd = "AuthenticAMD";

TEST(LowPrecision, EmulatedWithoutTheMatchingInstructions) {
  const std::string avx2 = " fpu sse2 avx avx2 fma ";
  const std::string avx512 = " avx2 avx512f avx512bw avx512vl ";
  const std::string avx512_bf16 = " avx2 avx512f avx512bw avx512_bf16 ";
  for (const char* vendor : {kIntel, kAmd, ""}) {
    EXPECT_EQ(LowPrecisionSpeedOn(at::kBFloat16, avx2, vendor),
              LowPrecisionSpeed::kEmulated);
    EXPECT_EQ(LowPrecisionSpeedOn(at::kBFloat16, avx512, vendor),
              LowPrecisionSpeed::kEmulated);
    EXPECT_EQ(LowPrecisionSpeedOn(at::kHalf, avx512_bf16, vendor),
              LowPrecisionSpeed::kEmulated);
    // A flag must match whole: avx512_bf16x is not avx512_bf16.
    EXPECT_EQ(LowPrecisionSpeedOn(at::kBFloat16, " avx512_bf16x ", vendor),
              LowPrecisionSpeed::kEmulated);
  }
}

TEST(LowPrecision, Bf16IsNoFasterOnIntelWithoutAmx) {
  // A Xeon model 207 whose hypervisor hides AMX, as /proc/cpuinfo lists it.
  const std::string xeon =
      " avx2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 ";
  EXPECT_EQ(LowPrecisionSpeedOn(at::kBFloat16, xeon, kIntel),
            LowPrecisionSpeed::kNoFaster);
  // The same flags on AMD (Zen 4): bf16 matmuls at 3x fp32.
  EXPECT_EQ(LowPrecisionSpeedOn(at::kBFloat16, xeon, kAmd),
            LowPrecisionSpeed::kFaster);
  // AMX makes bf16 fast on Intel.
  const std::string amx = xeon + "amx_bf16 amx_tile amx_int8 ";
  EXPECT_EQ(LowPrecisionSpeedOn(at::kBFloat16, amx, kIntel),
            LowPrecisionSpeed::kFaster);
  EXPECT_EQ(LowPrecisionSpeedOn(at::kBFloat16, " avx2 amx_bf16 ", kIntel),
            LowPrecisionSpeed::kFaster);
  // A CPU of unknown vendor is not judged by Intel's units.
  EXPECT_EQ(LowPrecisionSpeedOn(at::kBFloat16, xeon, ""),
            LowPrecisionSpeed::kFaster);
  // fp16 is judged by its own instructions only.
  EXPECT_EQ(LowPrecisionSpeedOn(at::kHalf, xeon, kIntel),
            LowPrecisionSpeed::kFaster);
  EXPECT_EQ(LowPrecisionSpeedOn(at::kHalf, " avx2 amx_bf16 amx_fp16 ", kIntel),
            LowPrecisionSpeed::kFaster);
}

TEST(LowPrecision, Fp32AndUnknownCpusNeverWarn) {
  for (const char* vendor : {kIntel, kAmd, ""}) {
    EXPECT_EQ(LowPrecisionSpeedOn(at::kFloat, " avx2 ", vendor),
              LowPrecisionSpeed::kFaster);
    EXPECT_EQ(LowPrecisionSpeedOn(at::kDouble, " avx2 ", vendor),
              LowPrecisionSpeed::kFaster);
    EXPECT_EQ(LowPrecisionSpeedOn(at::kBFloat16, " ", vendor),
              LowPrecisionSpeed::kFaster);
    EXPECT_EQ(LowPrecisionSpeedOn(at::kBFloat16, "", vendor),
              LowPrecisionSpeed::kFaster);
  }
}

// This machine's own /proc/cpuinfo reads back as the check expects it.
TEST(LowPrecision, ThisCpuIsRead) {
  const std::string flags = launch::CpuFlags();
  ASSERT_FALSE(flags.empty());
  EXPECT_EQ(flags.front(), ' ');
  EXPECT_EQ(flags.back(), ' ');
#if defined(__x86_64__)
  EXPECT_NE(flags.find(" sse2 "), std::string::npos) << flags;
  const std::string vendor = launch::CpuVendor();
  EXPECT_FALSE(vendor.empty());
  EXPECT_EQ(vendor.find_first_of(" \t:"), std::string::npos) << vendor;
#endif
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
