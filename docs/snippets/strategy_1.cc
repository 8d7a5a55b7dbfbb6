// generated from docs/strategy.md by docs/snippets/extract.py; edit the page, not this file
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "core/models/gpt_module.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/trainer.h"

using namespace fsdp2;

int main() {
  strategy::FSDP2StrategyOptions options;
  options.mp_policy = fsdp::MixedPrecisionPolicy{};  // fp32
  strategy::FSDP2Strategy s(options);
  s.setup_environment();  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
  models::GPTConfig config;
  config.vocab_size = 64;
  config.block_size = 16;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 32;
  s.connect(std::make_shared<models::GPTModule>(config, models::GPT2AdamW(3e-3)));
  s.parallelize();
  torch::manual_seed(0);  // the same 64 windows of 17 tokens on every rank
  at::Tensor windows = torch::randint(64, {64, 17}, torch::kLong);
  auto train = s.process_dataloader({windows.narrow(1, 0, 16), windows.narrow(1, 1, 16)},
                                    /*global_batch_size=*/8);  // 4 rows per rank
  strategy::TrainerOptions t;
  t.max_steps = 4;
  t.gradient_clip_val = 1.0;
  t.progress_bar = 0;
  strategy::Trainer trainer(s, t);
  trainer.fit(train);
  if (trainer.history().size() != 4) throw std::runtime_error("expected 4 steps");
  for (const auto& m : trainer.history()) {
    if (!std::isfinite(m.loss)) throw std::runtime_error("loss is not finite");
  }
  return 0;
}
