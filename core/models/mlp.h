// fsdp2/core/models/mlp.h
//
// Small models built from stock modules, for tests and examples:
//  - MLP: an input Linear, `depth` residual blocks (each a Sequential of
//    LayerNorm, Linear, ReLU, Linear) in a ModuleList, and an output Linear.
//  - ConvNet: Conv2d layers followed by a Linear classifier.
#ifndef FSDP2_CORE_MODELS_MLP_H_
#define FSDP2_CORE_MODELS_MLP_H_

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace fsdp2 {
namespace models {

struct MLPConfig {
  int64_t in_features = 16;
  int64_t hidden = 32;
  int64_t out_features = 4;
  int64_t depth = 2;
};

class MLPBlockImpl : public torch::nn::Module {
 public:
  explicit MLPBlockImpl(int64_t hidden);
  at::Tensor forward(const at::Tensor& x);  // x + net(x)
  torch::nn::Sequential net{nullptr};
};
TORCH_MODULE(MLPBlock);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const MLPConfig& config);
  at::Tensor forward(const at::Tensor& x);
  MLPBlock block(size_t i) const;

  torch::nn::Linear input{nullptr}, output{nullptr};
  torch::nn::ModuleList blocks{nullptr};
};
TORCH_MODULE(MLP);

class ConvNetImpl : public torch::nn::Module {
 public:
  // Input [B, channels, size, size]; output [B, classes].
  ConvNetImpl(int64_t channels, int64_t size, int64_t classes);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(ConvNet);

}  // namespace models
}  // namespace fsdp2

#endif  // FSDP2_CORE_MODELS_MLP_H_
