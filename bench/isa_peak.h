// fsdp2/bench/isa_peak.h
//
// One core's peak arithmetic, measured rather than assumed: independent
// chains of fp32 fused multiply-adds (AVX-512, else AVX2) and of bf16 dot
// products (AVX512-BF16's vdpbf16ps), timed back to back. Their ratio is the
// most bf16 compute can gain over fp32 on this core without AMX. It is
// 0.49 on an Intel Xeon model 207 with AVX512-BF16 and no AMX flags, whose
// fp32 FMA units are 512 bits wide. Zen 4's are 256 bits wide, and there
// bf16 matmuls measured 3x fp32's.
#ifndef FSDP2_BENCH_ISA_PEAK_H_
#define FSDP2_BENCH_ISA_PEAK_H_

#include <string>

namespace fsdp2 {
namespace bench {

struct IsaPeak {
  std::string fp32_isa;     // "avx512f", "avx2" or "" (not measured)
  double fp32_gflops = 0;   // one core, fused multiply-add chains
  double bf16_gflops = 0;   // vdpbf16ps chains; 0 without AVX512-BF16
  bool amx = false;         // AMX-BF16 present: oneDNN's bf16 matmuls use it,
                            // and its peak is not measured here
};

// Takes about half a second. `cpu_flags` as launch::CpuFlags() returns them.
IsaPeak MeasureIsaPeak(const std::string& cpu_flags);

// "fp32 (avx512f) 175 GFLOP/s, bf16 (avx512_bf16) 86 GFLOP/s: bf16 / fp32
// 0.49", or what could not be measured; notes AMX where it is present.
std::string DescribeIsaPeak(const IsaPeak& peak);

}  // namespace bench
}  // namespace fsdp2

#endif  // FSDP2_BENCH_ISA_PEAK_H_
