// The built-in GPT's logits on fixed tokens, from a full checkpoint, for the
// PyTorch interop test:
//   gpt_logits CKPT_DIR VOCAB BLOCK N_LAYER N_HEAD N_EMBD OUT.safetensors
// loads CKPT_DIR/checkpoint.safetensors into a plain (unsharded) GPT by
// parameter name and writes {"tokens", "logits"} to OUT.
#include <ATen/ATen.h>

#include <iostream>
#include <string>

#include "core/checkpoint/safetensors.h"
#include "core/models/gpt.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::cerr << "usage: gpt_logits CKPT_DIR VOCAB BLOCK N_LAYER N_HEAD N_EMBD OUT\n";
    return 2;
  }
  using fsdp2::checkpoint::SafetensorsFile;
  fsdp2::models::GPTConfig config;
  config.vocab_size = std::stoll(argv[2]);
  config.block_size = std::stoll(argv[3]);
  config.n_layer = std::stoll(argv[4]);
  config.n_head = std::stoll(argv[5]);
  config.n_embd = std::stoll(argv[6]);
  fsdp2::models::GPT gpt(config);
  const SafetensorsFile f(std::string(argv[1]) + "/checkpoint.safetensors");
  {
    at::NoGradGuard no_grad;
    for (auto& item : gpt->named_parameters()) item.value().copy_(f.load(item.key()));
  }
  gpt->eval();
  const int64_t T = config.block_size;
  at::Tensor tokens = (at::arange(2 * T, at::kLong) * 7 + 3).remainder(config.vocab_size).view({2, T});
  at::NoGradGuard no_grad;
  fsdp2::checkpoint::WriteSafetensors(argv[7], {{"tokens", tokens}, {"logits", gpt->forward(tokens)}});
  return 0;
}
