// generated from README.md by docs/snippets/extract.py; edit the page, not this file
#include <torch/torch.h>

#include <iostream>

#include "core/models/gpt_module.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/trainer.h"

int main() {
  using namespace fsdp2;
  strategy::FSDP2StrategyOptions options;  // dp/tp "auto", FULL_SHARD
  options.mp_policy = {};                  // fp32 (the default computes in bf16)
  strategy::FSDP2Strategy s(options);
  s.setup_environment();  // torchrun / srun / mpirun variables, or one process
  models::GPTConfig config;
  config.vocab_size = 64, config.block_size = 16, config.n_embd = 32;
  s.connect(std::make_shared<models::GPTModule>(config, models::GPT2AdamW(1e-2)));
  s.parallelize();        // each transformer block a unit, then the root
  auto seq = torch::arange(64 * 17).reshape({64, 17}).mul(3).remainder(64);
  auto data = s.process_dataloader({seq.slice(1, 0, 16), seq.slice(1, 1, 17)}, 8);
  strategy::TrainerOptions t;
  t.max_steps = 20, t.gradient_clip_val = 1.0, t.progress_bar = 0;
  strategy::Trainer trainer(s, t);
  auto& steps = trainer.fit(data);
  std::cout << "loss " << steps.front().loss << " -> " << steps.back().loss << "\n";
  return steps.back().loss < steps.front().loss ? 0 : 1;
}
