#include "core/strategy/optimizer.h"
#include "core/common/error.h"
#include "core/strategy/fused_adamw.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <stdexcept>
#include <unordered_set>

namespace fsdp2 {
namespace strategy {

OptimizerKind ParseOptimizerKind(const std::string& name) {
  if (name == "adamw") return OptimizerKind::kAdamW;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "sgd") return OptimizerKind::kSGD;
  throw InvalidArgumentError("unknown optimizer '" + name +
                              "' (known: adamw, adam, sgd)");
}

const char* ToString(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kSGD: return "sgd";
  }
  return "?";
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const std::vector<at::Tensor>& all_params, const OptimizerOptions& o) {
  // A tensor registered in several modules (tied weights) is listed once
  // per place by torch::nn::Module::parameters(); stepping it once per
  // place would update it several times.
  std::vector<at::Tensor> params;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& p : all_params) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  }
  switch (o.kind) {
    case OptimizerKind::kAdamW:
      return std::make_unique<FusedAdamW>(
          params, torch::optim::AdamWOptions(o.lr)
                      .betas({o.beta1, o.beta2})
                      .eps(o.eps)
                      .weight_decay(o.weight_decay));
    case OptimizerKind::kAdam:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(o.lr)
                      .betas({o.beta1, o.beta2})
                      .eps(o.eps)
                      .weight_decay(o.weight_decay));
    case OptimizerKind::kSGD:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(o.lr)
                      .momentum(o.momentum)
                      .weight_decay(o.weight_decay));
  }
  throw InvalidArgumentError("unknown optimizer kind " +
                              std::to_string(static_cast<int>(o.kind)));
}

}  // namespace strategy
}  // namespace fsdp2
