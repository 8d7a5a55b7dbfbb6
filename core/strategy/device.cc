#include "core/strategy/device.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>

#include <iostream>
#include <stdexcept>

#include "core/common/error.h"
#include "core/fsdp/assign_data.h"

#ifdef FSDP2_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include "core/launch/local_launcher.h"

namespace fsdp2 {
namespace strategy {
namespace {

// Whether this build links LibTorch's CUDA (at::hasCUDA() says whether a
// device is usable, which a CUDA build without a GPU is not).
#ifdef FSDP2_WITH_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

}  // namespace

DeviceSpec DeviceSpec::Parse(const std::string& text) {
  if (text == "auto") return Auto();
  if (text == "cpu") return Cpu();
  if (text == "cuda") return Cuda();
  const std::string digits = text.rfind("cuda:", 0) == 0 ? text.substr(5) : "";
  if (!digits.empty() && digits.size() <= 4 &&
      digits.find_first_not_of("0123456789") == std::string::npos) {
    return Cuda(std::stoi(digits));
  }
  throw InvalidArgumentError("device must be auto, cpu, cuda or cuda:K (\"cuda:K\": the GPU "
                             "numbered K), got \"" + text + "\"");
}

std::string DeviceSpec::ToString() const {
  switch (kind) {
    case DeviceKind::kAuto: return "auto";
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCuda: return index < 0 ? "cuda" : "cuda:" + std::to_string(index);
  }
  return "?";
}

at::Device ResolveDevice(const std::string& device, int local_rank) {
  return ResolveDevice(DeviceSpec::Parse(device), local_rank);
}

at::Device ResolveDevice(const DeviceSpec& device, int local_rank) {
  const auto accelerator = at::accelerator::getAccelerator(/*checked=*/false);
  const int gpus = accelerator && *accelerator == at::kCUDA
                       ? static_cast<int>(at::accelerator::deviceCount())
                       : 0;
  if (device.kind == DeviceKind::kCpu || (device.kind == DeviceKind::kAuto && gpus == 0)) {
    return at::Device(at::kCPU);
  }
  const int index = device.kind == DeviceKind::kCuda && device.index >= 0
                        ? device.index
                        : (gpus > 0 ? local_rank % gpus : 0);
  const std::string name = device.ToString();
  if (gpus == 0) {
    throw InvalidArgumentError(
        "FSDP2Strategy: device '" + name + "' but this process sees no CUDA device (" +
        std::string(kCudaBuild ? "none visible: check CUDA_VISIBLE_DEVICES and the driver"
                               : "this LibTorch has no CUDA") +
        "); use device \"cpu\" or \"auto\"");
  }
  if (index >= gpus) {
    throw InvalidArgumentError("FSDP2Strategy: device '" + name + "' but this process sees " +
                                std::to_string(gpus) + " GPU(s)");
  }
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void LimitDeviceMemory(const c10::Device& device, double gib, int rank) {
  if (!device.is_cuda()) {
    if (rank == 0) {
      std::cerr << "fsdp2: gpu_memory_limit_gib " << gib
                << " ignored: this rank trains on the CPU\n";
    }
    return;
  }
#ifdef FSDP2_WITH_CUDA
  const double total = static_cast<double>(
      at::getDeviceAllocator(device.type())->getMemoryInfo(device.index()).second);
  const double want = gib * static_cast<double>(int64_t{1} << 30);
  if (want > total) {
    throw InvalidArgumentError("FSDP2Strategy: gpu_memory_limit_gib " + std::to_string(gib) +
                               " is more than " + device.str() + " has (" +
                               std::to_string(total / static_cast<double>(int64_t{1} << 30)) +
                               " GiB)");
  }
  c10::cuda::CUDACachingAllocator::setMemoryFraction(want / total, device.index());
#endif
}

LowPrecisionSpeed LowPrecisionSpeedOn(at::ScalarType dtype,
                                      const std::string& cpu_flags,
                                      const std::string& cpu_vendor) {
  auto has = [&](const char* flag) { return launch::HasCpuFlag(cpu_flags, flag); };
  if (cpu_flags.find_first_not_of(' ') == std::string::npos) {
    return LowPrecisionSpeed::kFaster;  // unknown CPU: nothing to say
  }
  if (dtype == at::kBFloat16) {
    if (has("amx_bf16")) return LowPrecisionSpeed::kFaster;
    if (!has("avx512_bf16")) return LowPrecisionSpeed::kEmulated;
    return cpu_vendor == "GenuineIntel" ? LowPrecisionSpeed::kNoFaster
                                        : LowPrecisionSpeed::kFaster;
  }
  if (dtype == at::kHalf && !has("avx512_fp16") && !has("amx_fp16")) {
    return LowPrecisionSpeed::kEmulated;
  }
  return LowPrecisionSpeed::kFaster;
}

void WarnIfLowPrecisionIsSlow(const fsdp::MixedPrecisionPolicy& mp, int rank) {
  if (rank != 0 || !mp.param_dtype) return;
  const at::ScalarType dtype = *mp.param_dtype;
  const bool bf16 = dtype == at::kBFloat16;
  const LowPrecisionSpeed speed =
      LowPrecisionSpeedOn(dtype, launch::CpuFlags(), launch::CpuVendor());
  if (speed == LowPrecisionSpeed::kFaster) return;
  std::cerr << "fsdp2: warning: ";
  if (speed == LowPrecisionSpeed::kEmulated) {
    std::cerr << (bf16 ? "bf16" : "fp16")
              << " compute has no native support on this CPU (no "
              << (bf16 ? "AVX512-BF16 or AMX-BF16" : "AVX512-FP16 or AMX-FP16")
              << ") and runs emulated, measured up to 13x slower than fp32";
  } else {
    std::cerr << "bf16 compute is no faster than fp32 on this CPU (AVX512-BF16 "
                 "without AMX on an Intel CPU: bf16 matmuls measured at 0.6x "
                 "and a GPT step at 0.7x of fp32's speed)";
  }
  std::cerr << "; choose fp32 precision (C ABI: FSDP2_PRECISION_FP32, "
               "Python/Java precision \"fp32\", C++: an empty "
               "MixedPrecisionPolicy) unless you need it\n";
}

void MoveRealTensors(torch::nn::Module& module, const c10::Device& device) {
  torch::NoGradGuard no_grad;
  auto move = [&](at::Tensor& t) {
    if (!t.defined() || t.is_meta() || t.device() == device) return;
    fsdp::assign_data(t, t.to(device));
  };
  for (auto& p : module.parameters(/*recurse=*/true)) move(p);
  for (auto& b : module.buffers(/*recurse=*/true)) move(b);
}

}  // namespace strategy
}  // namespace fsdp2
