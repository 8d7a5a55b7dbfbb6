// fsdp2/tests/strategy_util.h
//
// What the FSDP2Strategy tests share: the strategy options they run with,
// the GPT and MLP TrainingModules they train (core/models' modules in
// float64 and float32 with the tests' AdamW), and the single-process
// reference they compare a multi-rank run with. The fixtures below the
// strategy layer (TinyGPT, TokenWindows, TestOptimizer) are in
// training_util.h.
#ifndef FSDP2_TESTS_STRATEGY_UTIL_H_
#define FSDP2_TESTS_STRATEGY_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/models/gpt_module.h"
#include "core/models/mlp_module.h"
#include "core/strategy/distributed_sampler.h"
#include "core/strategy/fsdp2_strategy.h"
#include "tests/training_util.h"

namespace fsdp2 {
namespace testing {

// Options for a strategy test: the parameters' own dtype throughout (no
// mixed precision), torch::manual_seed(seed) on every rank, the sampler's
// seed, and a 60 s collective timeout.
strategy::FSDP2StrategyOptions TestStrategyOptions(uint64_t seed, uint64_t sampler_seed = 0);

// The GPT of `config` in float64 with TestOptimizer("adamw"); built from
// the default generator like any module.
std::shared_ptr<models::GPTModule> TestGPTModule(const models::GPTConfig& config = TinyGPT());

// TinyGPT with `n_head` heads and n_embd 24 (12 heads of 2 by default:
// tensor parallelism over 2, 3 or 4 ranks splits whole heads).
models::GPTConfig HeadsGPT(int64_t n_head = 12);

// The parameters (names and detached copies) of TestGPTModule(config)
// built after torch::manual_seed(seed): a full state dict for every run of
// a test to start from, whatever the strategy's own seed.
std::vector<std::pair<std::string, at::Tensor>> InitialGPTState(const models::GPTConfig& config,
                                                               uint64_t seed);

// A sampler of `global_batch` rows per step shuffled with `seed`.
strategy::DistributedSamplerOptions TestSamplerOptions(uint64_t seed, int64_t global_batch);

// The MLP of `config` in float32 (as built) with TestOptimizer("adamw").
std::shared_ptr<models::MLPModule> TestMLPModule(const models::MLPConfig& config);

// The rows `index` of every tensor of `data`.
strategy::Batch SelectRows(const strategy::Batch& data, const std::vector<int64_t>& index);

// One process, no FSDP: `steps` optimizer steps of `module` (its
// training_step, then clipping to `clip` when positive) on the global
// batches `sampler` draws from `data`. Returns each step's loss and, when
// clipping, the gradient norm before clipping.
struct ReferenceRun {
  std::vector<double> losses, grad_norms;
};
// On `device` (a GPU): the module is moved there first and each batch copied.
ReferenceRun TrainOneProcess(strategy::TrainingModule& module, const strategy::Batch& data,
                             const strategy::DistributedSampler& sampler, int steps,
                             double clip = 0, const at::Device& device = at::kCPU);

}  // namespace testing
}  // namespace fsdp2

#endif  // FSDP2_TESTS_STRATEGY_UTIL_H_
