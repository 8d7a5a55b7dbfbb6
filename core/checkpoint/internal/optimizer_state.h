// fsdp2/core/checkpoint/internal/optimizer_state.h
//
// Per-parameter optimizer state of the stock optimizers checkpoints support
// (AdamW, Adam, SGD), as plain tensors shaped like the parameter's shard.
#ifndef FSDP2_CORE_CHECKPOINT_INTERNAL_OPTIMIZER_STATE_H_
#define FSDP2_CORE_CHECKPOINT_INTERNAL_OPTIMIZER_STATE_H_

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <string>
#include <vector>

namespace fsdp2 {
namespace checkpoint {
namespace internal {

// Optimizer state of one parameter: its step and tensors shaped like it.
struct ParamState {
  int64_t step = 0;
  std::map<std::string, at::Tensor> tensors;
};

// The state tensor keys any supported optimizer may have.
const std::vector<std::string>& StateKeys();

// "adamw", "adam", "sgd", or "none" for nullptr; throws
// std::invalid_argument for other optimizers.
std::string OptimizerKind(torch::optim::Optimizer* optimizer);

c10::optional<ParamState> GetState(torch::optim::Optimizer& optimizer,
                                   const at::Tensor& param);
void SetState(torch::optim::Optimizer& optimizer, const std::string& kind,
              const at::Tensor& param, const ParamState& state);

// Before restoring optimizer state for `params`: throws std::runtime_error
// (prefixed by `where`) unless the optimizer holds exactly these parameters.
// No state at all (a checkpoint saved before the first step) is accepted.
void CheckOptimizerHolds(torch::optim::Optimizer& optimizer,
                         const std::vector<std::pair<std::string, at::Tensor>>& params,
                         const std::string& where);

// The optimizer's per-group hyper-parameters (lr, betas, eps, weight decay,
// ... as its kind has them) as a JSON array, and their restoration. Throws
// std::runtime_error (prefixed by `where`) if the group counts differ.
std::string GroupOptionsJson(torch::optim::Optimizer& optimizer, const std::string& kind);
void SetGroupOptions(torch::optim::Optimizer& optimizer, const std::string& kind,
                     const std::string& json, const std::string& where);

// Elements per dim-0 row of a parameter of this global shape (1 for 0-d).
int64_t RowNumel(const std::vector<int64_t>& global_shape);

}  // namespace internal
}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_INTERNAL_OPTIMIZER_STATE_H_
