// fsdp2/core/strategy/optimizer.h
//
// The optimizers a TrainingModule's configure_optimizers() usually builds,
// described by one plain struct: AdamW, Adam, or SGD with momentum, with
// their hyper-parameters. The built-in model modules (core/models), the
// examples, the benchmarks and the tests describe their optimizer with it;
// its fields and defaults are those of the C ABI's fsdp2_optimizer_options_t.
#ifndef FSDP2_CORE_STRATEGY_OPTIMIZER_H_
#define FSDP2_CORE_STRATEGY_OPTIMIZER_H_

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

namespace fsdp2 {
namespace strategy {

// The optimizer MakeOptimizer builds: AdamW (as FusedAdamW), torch's Adam
// or torch's SGD.
enum class OptimizerKind { kAdamW, kAdam, kSGD };

// "adamw", "adam" or "sgd". Throws std::invalid_argument naming the choices.
OptimizerKind ParseOptimizerKind(const std::string& name);
// "adamw", "adam" or "sgd" (static storage): ParseOptimizerKind's input.
const char* ToString(OptimizerKind kind);

// An optimizer and its hyper-parameters; the defaults are the C ABI's.
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;  // default AdamW
  double lr = 1e-3;  // learning rate; default 1e-3
  double beta1 = 0.9;  // Adam and AdamW: first-moment decay; default 0.9
  double beta2 = 0.999;  // Adam and AdamW: second-moment decay; default 0.999
  double eps = 1e-8;  // Adam and AdamW
  double weight_decay = 0.01;  // decoupled for AdamW; an L2 term for Adam, SGD
  double momentum = 0;         // SGD
};

// A new optimizer of `options.kind` over `params` (for a sharded module,
// its local shards), each distinct tensor once (tied weights appear once
// per module that registers them). Throws std::invalid_argument for an
// unknown kind.
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const std::vector<at::Tensor>& params, const OptimizerOptions& options);

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_OPTIMIZER_H_
