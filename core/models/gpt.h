// fsdp2/core/models/gpt.h
//
// A GPT-2-style decoder-only transformer built from stock torch::nn modules:
// token and position embeddings, n_layer pre-LayerNorm blocks (causal
// self-attention and a GELU MLP, each with a residual), a final LayerNorm and
// an LM head tied to the token embedding. Blocks are called through
// fsdp::forward, so each block can be its own FSDP unit, and the attention
// and MLP projections through tp::forward, so they can be tensor-parallel:
// GPT provides a tensor-parallel plan (q, k, v and the MLP's fc column-wise,
// split by heads; the attention and MLP output projections row-wise;
// embeddings, LayerNorms and the tied head replicated), and its attention
// computes the heads whose q, k, v this rank holds.
#ifndef FSDP2_CORE_MODELS_GPT_H_
#define FSDP2_CORE_MODELS_GPT_H_

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <string>

#include "core/tp/plan.h"

namespace fsdp2 {
namespace models {

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t block_size = 64;  // maximum sequence length
  int64_t n_layer = 2;
  int64_t n_head = 2;
  int64_t n_embd = 64;
  // Dropout probability in training (GPT-2's places: after the embeddings,
  // on the attention weights, after each residual branch). 0: no dropout
  // op runs at all, and no random number is drawn.
  double dropout = 0;

  // Throws std::invalid_argument if a size is not positive, n_embd is not a
  // multiple of n_head, or dropout is outside [0, 1).
  void Validate() const;
  // Parameter count (the tied head counted once).
  int64_t NumParams() const;
  std::string ToString() const;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& config);
  // [B, T, C] -> [B, T, C]. Under tensor parallelism qkv yields this rank's
  // heads (a multiple of head_dim per q, k and v) and proj sums over ranks.
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  int64_t head_dim_;
  double dropout_;
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& config);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, fc_proj{nullptr};

 private:
  double dropout_;
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module,
                public tp::TensorParallelPlanProvider {
 public:
  explicit GPTImpl(const GPTConfig& config);
  // tokens: [B, T] int64 with T <= block_size. Returns logits [B, T, vocab].
  at::Tensor forward(const at::Tensor& tokens);
  // The mean cross-entropy of the predictions for `tokens` against
  // `targets` [B, T] (targets -100 ignored): LanguageModelLoss(forward(
  // tokens), targets), which it runs on the CPU. On a GPU the LM head and
  // the loss are fused and chunked (kernels::LinearCrossEntropy): no logits
  // for the whole batch, the loss computed in float32 from the chunk's
  // logits in the activations' dtype.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& targets);

  const GPTConfig& config() const { return config_; }
  Block block(size_t i) const;
  // Column-wise qkv (3 fused parts) and fc, row-wise proj and fc_proj.
  // Throws std::invalid_argument unless tp_size divides n_head (each rank
  // computes whole heads).
  tp::TensorParallelPlan tensor_parallel_plan(int tp_size) const override;

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  // The last LayerNorm's output [B, T, n_embd]: what the head reads.
  at::Tensor hidden(const at::Tensor& tokens);

  GPTConfig config_;
};
TORCH_MODULE(GPT);

// Dropout with probability `p` in training; `x` itself when p is 0 or the
// module is in evaluation mode.
at::Tensor Dropout(const at::Tensor& x, double p, bool training);

// Mean cross-entropy of logits [B, T, V] against targets [B, T].
at::Tensor LanguageModelLoss(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace models
}  // namespace fsdp2

#endif  // FSDP2_CORE_MODELS_GPT_H_
