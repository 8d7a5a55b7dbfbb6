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

// A deferred model's real tensors move; its meta ones stay for
// materialisation (moved to the meta device here, which every machine has).
TEST(Device, MoveRealTensorsLeavesDeferredOnesAlone) {
  struct Net : torch::nn::Module {
    at::Tensor real, deferred, buffer;
    Net() {
      real = register_parameter("real", torch::ones({2, 3}));
      deferred = register_parameter("deferred", torch::empty({4}, torch::kMeta));
      buffer = register_buffer("buffer", torch::arange(3));
    }
  } net;
  const auto* deferred_impl = net.deferred.unsafeGetTensorImpl();
  MoveRealTensors(net, c10::Device(c10::kMeta));
  EXPECT_TRUE(net.real.is_meta());
  EXPECT_TRUE(net.real.requires_grad());
  EXPECT_EQ(net.real.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(net.named_buffers()["buffer"].is_meta());
  // The same tensor objects: module members and slots stay valid.
  EXPECT_TRUE(net.named_parameters()["real"].is_same(net.real));
  EXPECT_EQ(net.deferred.unsafeGetTensorImpl(), deferred_impl);
  MoveRealTensors(net, c10::Device(c10::kCPU));  // meta tensors hold no memory: left alone
  EXPECT_TRUE(net.real.is_meta());
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
