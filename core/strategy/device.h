// fsdp2/core/strategy/device.h
//
// Which device a rank trains on (FSDP2StrategyOptions::device resolved), and
// how fast low-precision compute is on a CPU.
#ifndef FSDP2_CORE_STRATEGY_DEVICE_H_
#define FSDP2_CORE_STRATEGY_DEVICE_H_

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <string>

#include "core/fsdp/mixed_precision.h"

namespace fsdp2 {
namespace strategy {

// Where a rank is asked to train (FSDP2StrategyOptions::device), before
// setup_environment() resolves it for the rank (ResolveDevice).
enum class DeviceKind {
  kAuto,  // its GPU where CUDA devices are visible, else the CPU
  kCpu,   // the CPU, even where GPUs are visible
  kCuda,  // a GPU: `index`, or the local rank's
};

// A device kind with its GPU number: the typed form of "auto", "cpu",
// "cuda" and "cuda:K", which front ends parse once (Parse) and core reads.
struct DeviceSpec {
  DeviceKind kind = DeviceKind::kAuto;  // default: auto
  // kCuda only: the GPU's number K ("cuda:K"), or -1 ("cuda"): the local
  // rank's, modulo the visible GPUs.
  int index = -1;

  // auto, the default.
  static DeviceSpec Auto() { return {}; }
  // The CPU.
  static DeviceSpec Cpu() { return {DeviceKind::kCpu, -1}; }
  // GPU `index`; -1: the local rank's.
  static DeviceSpec Cuda(int index = -1) { return {DeviceKind::kCuda, index}; }
  // "auto", "cpu", "cuda" or "cuda:K" (K a GPU number, at most 4 digits).
  // Throws InvalidArgumentError naming the accepted forms otherwise.
  static DeviceSpec Parse(const std::string& text);
  // The text Parse reads back: "auto", "cpu", "cuda" or "cuda:K".
  std::string ToString() const;
  // The same kind and index.
  bool operator==(const DeviceSpec& other) const {
    return kind == other.kind && index == other.index;
  }
};

// `device` for the rank `local_rank` of its host: auto is the CPU where no
// CUDA device is visible, else as cuda; cuda without an index is GPU
// local_rank modulo the visible GPUs (ranks beyond the GPUs share them).
// Throws InvalidArgumentError for a GPU that is not there, or cuda where
// none is visible.
c10::Device ResolveDevice(const DeviceSpec& device, int local_rank);
// ResolveDevice(DeviceSpec::Parse(device), local_rank): for a name.
c10::Device ResolveDevice(const std::string& device, int local_rank);

// FSDP2StrategyOptions::gpu_memory_limit_gib: caps the caching allocator of
// `device` (a GPU) at `gib` GiB for this process, as PyTorch's
// set_per_process_memory_fraction does, so that a smaller GPU is emulated:
// an allocation past the cap fails with LibTorch's out-of-memory error. On
// the CPU it changes nothing; rank `rank` 0 says so on stderr. Throws
// InvalidArgumentError when `gib` is more than the GPU has.
void LimitDeviceMemory(const c10::Device& device, double gib, int rank);

// How compute in `dtype` (bf16 or fp16) compares with fp32 on a CPU with
// these /proc/cpuinfo flags (launch::CpuFlags(): " flag flag ... ") and
// vendor (launch::CpuVendor()):
//  kEmulated  no native instructions (bf16: AVX512-BF16 or AMX-BF16; fp16:
//             AVX512-FP16 or AMX-FP16): a GPT step in bf16 was measured 13x
//             slower than in fp32 on an AVX2 CPU;
//  kNoFaster  bf16 on an Intel CPU with AVX512-BF16 but no AMX-BF16 (Cooper
//             Lake, or a newer Xeon whose hypervisor hides AMX): its bf16 dot
//             product does the work of its two fp32 FMA units and no more;
//             oneDNN's bf16 matmuls ran at 0.6x of OpenBLAS's fp32 (80
//             against 122-142 GFLOP/s on one core of a Xeon model 207) and
//             a GPT step at 0.7x of fp32's speed;
//  kFaster    otherwise: AMX, or AVX512-BF16 on AMD (Zen 4, whose fp32 units
//             are 256 bits wide: bf16 matmuls at 3x fp32 measured); also
//             other dtypes and an unknown CPU (no flags), of which nothing
//             is claimed.
// parallelize() warns on rank 0 when the policy's param_dtype is not
// kFaster; the policy stays as asked.
enum class LowPrecisionSpeed { kFaster, kNoFaster, kEmulated };
// The class above of `dtype` on the CPU that `cpu_flags` and `cpu_vendor`
// describe. Pure: reads nothing of the machine itself, so tests pass any.
LowPrecisionSpeed LowPrecisionSpeedOn(at::ScalarType dtype,
                                      const std::string& cpu_flags,
                                      const std::string& cpu_vendor);

// Rank 0 (`rank`) says once on stderr when `mp`'s compute dtype would train
// slower than fp32 on this CPU (LowPrecisionSpeedOn); the policy stays as
// asked. For ranks training on the CPU.
void WarnIfLowPrecisionIsSlow(const fsdp::MixedPrecisionPolicy& mp, int rank);

// Moves the parameters and buffers of `module` (recursively) that hold
// memory to `device`, in place (the same tensor objects, as Module::to
// does); meta tensors, a deferred model's, stay where they are for
// materialisation to place. For a model built under tensor_init_context()
// that trains on a GPU.
void MoveRealTensors(torch::nn::Module& module, const c10::Device& device);

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_DEVICE_H_
