#include "core/models/mlp.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/normalization.h>

#include "core/fsdp/fully_shard.h"

namespace fsdp2 {
namespace models {

MLPBlockImpl::MLPBlockImpl(int64_t hidden) {
  net = register_module(
      "net", torch::nn::Sequential(
                 torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})),
                 torch::nn::Linear(hidden, 2 * hidden), torch::nn::ReLU(),
                 torch::nn::Linear(2 * hidden, hidden)));
}

at::Tensor MLPBlockImpl::forward(const at::Tensor& x) {
  return x + net->forward(x);
}

MLPImpl::MLPImpl(const MLPConfig& config) {
  input = register_module("input",
                          torch::nn::Linear(config.in_features, config.hidden));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.depth; ++i) {
    blocks->push_back(MLPBlock(config.hidden));
  }
  output = register_module(
      "output", torch::nn::Linear(config.hidden, config.out_features));
}

MLPBlock MLPImpl::block(size_t i) const {
  return MLPBlock(blocks->ptr<MLPBlockImpl>(i));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  at::Tensor h = torch::relu(input->forward(x));
  for (size_t i = 0; i < blocks->size(); ++i) h = fsdp::forward(block(i), h);
  return output->forward(h);
}

ConvNetImpl::ConvNetImpl(int64_t channels, int64_t size, int64_t classes) {
  conv1 = register_module(
      "conv1", torch::nn::Conv2d(
                   torch::nn::Conv2dOptions(channels, 4, 3).padding(1)));
  conv2 = register_module(
      "conv2",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 6, 3).padding(1)));
  head = register_module("head", torch::nn::Linear(6 * size * size, classes));
}

at::Tensor ConvNetImpl::forward(const at::Tensor& x) {
  at::Tensor h = torch::relu(fsdp::forward(conv1, x));
  h = torch::relu(fsdp::forward(conv2, h));
  return head->forward(h.flatten(1));
}

}  // namespace models
}  // namespace fsdp2
