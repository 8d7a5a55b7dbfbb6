// Which device FSDP2StrategyOptions::device names (ResolveDevice), on this
// machine: the CPU cases everywhere, the CUDA ones as far as its GPUs allow.
#include "core/strategy/device.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>

#include "core/common/error.h"

namespace fsdp2 {
namespace strategy {
namespace {

std::string ErrorOf(const std::string& device, int local_rank = 0) {
  try {
    ResolveDevice(device, local_rank);
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(Device, CpuAndAutoWithoutAGpu) {
  EXPECT_EQ(ResolveDevice("cpu", 3), c10::Device(c10::kCPU));
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus == 0) {
    EXPECT_EQ(ResolveDevice("auto", 0), c10::Device(c10::kCPU));
    EXPECT_NE(ErrorOf("cuda").find("sees no CUDA device"), std::string::npos) << ErrorOf("cuda");
    EXPECT_NE(ErrorOf("cuda:0").find("sees no CUDA device"), std::string::npos);
  } else {
    // Ranks beyond the GPUs share them, round-robin.
    EXPECT_EQ(ResolveDevice("auto", gpus + 1), c10::Device(c10::kCUDA, 1 % gpus));
    EXPECT_EQ(ResolveDevice("cuda:0", 5), c10::Device(c10::kCUDA, 0));
    EXPECT_NE(ErrorOf("cuda:" + std::to_string(gpus)).find("GPU(s)"), std::string::npos);
  }
}

TEST(Device, NamesItDoesNotKnowAreClearErrors) {
  EXPECT_NE(ErrorOf("tpu").find("auto, cpu, cuda or cuda:K"), std::string::npos) << ErrorOf("tpu");
  EXPECT_NE(ErrorOf("cuda:x").find("cuda:K"), std::string::npos) << ErrorOf("cuda:x");
  EXPECT_NE(ErrorOf("cuda:-1").find("cuda:K"), std::string::npos) << ErrorOf("cuda:-1");
  EXPECT_NE(ErrorOf("CUDA").find("auto, cpu, cuda or cuda:K"), std::string::npos);
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
