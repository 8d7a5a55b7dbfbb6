#include "bench/isa_peak.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/launch/local_launcher.h"

namespace fsdp2 {
namespace bench {
namespace {

// Twelve independent accumulators: enough to hide the latency of every
// instruction measured here, so the loops run at issue throughput.
constexpr int kChains = 12;
constexpr long kIterations = 4000000;  // x 12 instructions per loop

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Each returns GFLOP/s; `sink` keeps the results alive.
__attribute__((target("avx512f"))) double Fp32Avx512(float* sink) {
  __m512 acc[kChains];
  const __m512 b = _mm512_set1_ps(1e-8f), c = _mm512_set1_ps(1.0f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const auto start = std::chrono::steady_clock::now();
  for (long it = 0; it < kIterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], c, b);
  }
  const double s = Seconds(start);
  float lanes[16];
  for (int i = 0; i < kChains; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    for (float v : lanes) *sink += v;
  }
  return kIterations * kChains * 16.0 * 2.0 / s / 1e9;  // 16 lanes, 2 FLOP
}

__attribute__((target("avx2,fma"))) double Fp32Avx2(float* sink) {
  __m256 acc[kChains];
  const __m256 b = _mm256_set1_ps(1e-8f), c = _mm256_set1_ps(1.0f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const auto start = std::chrono::steady_clock::now();
  for (long it = 0; it < kIterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], c, b);
  }
  const double s = Seconds(start);
  float lanes[8];
  for (int i = 0; i < kChains; ++i) {
    _mm256_storeu_ps(lanes, acc[i]);
    for (float v : lanes) *sink += v;
  }
  return kIterations * kChains * 8.0 * 2.0 / s / 1e9;
}

__attribute__((target("avx512f,avx512bf16"))) double Bf16Avx512(float* sink) {
  __m512 acc[kChains];
  // bf16 1.0 (0x3f80) times a small bf16 (0x3280): the sums stay normal.
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80);
  const __m512bh c = (__m512bh)_mm512_set1_epi16(0x3280);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const auto start = std::chrono::steady_clock::now();
  for (long it = 0; it < kIterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], b, c);
  }
  const double s = Seconds(start);
  float lanes[16];
  for (int i = 0; i < kChains; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    for (float v : lanes) *sink += v;
  }
  return kIterations * kChains * 32.0 * 2.0 / s / 1e9;  // 32 pairs, 2 FLOP
}

// Where the loops' sums end, so that the compiler keeps the loops.
volatile float g_sink = 0;

}  // namespace

IsaPeak MeasureIsaPeak(const std::string& cpu_flags) {
  auto has = [&](const char* flag) { return launch::HasCpuFlag(cpu_flags, flag); };
  IsaPeak peak;
  peak.amx = has("amx_bf16");
  float sink = 0;
  // Best of three: another process may take the core for a moment.
  for (int round = 0; round < 3; ++round) {
    if (has("avx512f")) {
      peak.fp32_isa = "avx512f";
      peak.fp32_gflops = std::max(peak.fp32_gflops, Fp32Avx512(&sink));
    } else if (has("avx2") && has("fma")) {
      peak.fp32_isa = "avx2";
      peak.fp32_gflops = std::max(peak.fp32_gflops, Fp32Avx2(&sink));
    }
    if (has("avx512f") && has("avx512_bf16")) {
      peak.bf16_gflops = std::max(peak.bf16_gflops, Bf16Avx512(&sink));
    }
  }
  g_sink = sink;
  return peak;
}

std::string DescribeIsaPeak(const IsaPeak& peak) {
  const std::string amx =
      peak.amx ? "; AMX present, not measured (oneDNN's bf16 matmuls use it)" : "";
  if (peak.fp32_isa.empty()) return "fp32 peak not measured (no AVX2 or AVX-512)" + amx;
  char buf[200];
  if (peak.bf16_gflops <= 0) {
    std::snprintf(buf, sizeof(buf),
                  "fp32 (%s) %.0f GFLOP/s; no AVX512-BF16 to measure",
                  peak.fp32_isa.c_str(), peak.fp32_gflops);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "fp32 (%s) %.0f GFLOP/s, bf16 (avx512_bf16) %.0f GFLOP/s: "
                  "bf16 / fp32 %.2f",
                  peak.fp32_isa.c_str(), peak.fp32_gflops, peak.bf16_gflops,
                  peak.bf16_gflops / peak.fp32_gflops);
  }
  return buf + amx;
}

}  // namespace bench
}  // namespace fsdp2
