#include "tests/strategy_util.h"

#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>

#include <chrono>

namespace fsdp2 {
namespace testing {

strategy::FSDP2StrategyOptions TestStrategyOptions(uint64_t seed, uint64_t sampler_seed) {
  strategy::FSDP2StrategyOptions o;
  o.mp_policy = fsdp::MixedPrecisionPolicy{};  // the parameters' own dtype
  o.seed = seed;
  o.data_sampler.seed = sampler_seed;
  o.timeout = std::chrono::seconds(60);
  o.device = strategy::DeviceSpec::Cpu();  // the same tests on a machine with a GPU (tests/gpu_test.cc uses it)
  return o;
}

std::shared_ptr<models::GPTModule> TestGPTModule(const models::GPTConfig& config) {
  return std::make_shared<models::GPTModule>(config, TestOptimizer("adamw"), at::kDouble);
}

models::GPTConfig HeadsGPT(int64_t n_head) {
  models::GPTConfig c = TinyGPT();
  c.n_head = n_head;
  c.n_embd = 24;
  return c;
}

std::vector<std::pair<std::string, at::Tensor>> InitialGPTState(const models::GPTConfig& config,
                                                               uint64_t seed) {
  torch::manual_seed(seed);
  auto m = TestGPTModule(config);
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& item : m->module()->named_parameters()) {
    state.emplace_back(item.key(), item.value().detach().clone());
  }
  return state;
}

strategy::DistributedSamplerOptions TestSamplerOptions(uint64_t seed, int64_t global_batch) {
  strategy::DistributedSamplerOptions o;
  o.seed = seed;
  o.global_batch_size = global_batch;
  return o;
}

std::shared_ptr<models::MLPModule> TestMLPModule(const models::MLPConfig& config) {
  return std::make_shared<models::MLPModule>(config, TestOptimizer("adamw"));
}

strategy::Batch SelectRows(const strategy::Batch& data, const std::vector<int64_t>& index) {
  const at::Tensor rows = at::tensor(index, at::kLong);
  strategy::Batch out;
  for (const auto& t : data) out.push_back(t.index_select(0, rows));
  return out;
}

ReferenceRun TrainOneProcess(strategy::TrainingModule& module, const strategy::Batch& data,
                             const strategy::DistributedSampler& sampler, int steps,
                             double clip, const at::Device& device) {
  if (!device.is_cpu()) module.module()->to(device);
  auto optimizer = module.configure_optimizers();
  ReferenceRun run;
  for (int i = 0; i < steps; ++i) {
    strategy::Batch batch = SelectRows(data, sampler.global_batch(i));
    for (auto& t : batch) t = t.to(device);
    at::Tensor loss = module.training_step(batch, i);
    loss.backward();
    if (clip > 0) {
      run.grad_norms.push_back(
          torch::nn::utils::clip_grad_norm_(module.module()->parameters(), clip));
    }
    optimizer->step();
    optimizer->zero_grad(/*set_to_none=*/false);
    run.losses.push_back(loss.item<double>());
  }
  return run;
}

}  // namespace testing
}  // namespace fsdp2
