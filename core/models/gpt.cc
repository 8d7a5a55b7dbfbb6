#include "core/models/gpt.h"
#include "core/common/error.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/normalization.h>
#include <torch/nn/init.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "core/fsdp/fully_shard.h"
#include "core/kernels/layer_norm.h"
#include "core/kernels/linear_cross_entropy.h"
#include "core/tp/parallelize.h"

namespace fsdp2 {
namespace models {
namespace F = torch::nn::functional;

void GPTConfig::Validate() const {
  if (vocab_size < 1 || block_size < 1 || n_layer < 1 || n_head < 1 ||
      n_embd < 1) {
    throw InvalidArgumentError("GPTConfig: all sizes must be positive: " +
                                ToString());
  }
  if (n_embd % n_head != 0) {
    throw InvalidArgumentError("GPTConfig: n_embd (" + std::to_string(n_embd) +
                                ") must be a multiple of n_head (" +
                                std::to_string(n_head) + ")");
  }
  if (!(dropout >= 0 && dropout < 1)) {
    throw InvalidArgumentError("GPTConfig: dropout must be in [0, 1), got " +
                                std::to_string(dropout));
  }
}

int64_t GPTConfig::NumParams() const {
  const int64_t c = n_embd;
  const int64_t per_block = 2 * 2 * c            // two LayerNorms
                            + c * 3 * c + 3 * c  // qkv
                            + c * c + c          // attention projection
                            + c * 4 * c + 4 * c  // fc
                            + 4 * c * c + c;     // fc projection
  return vocab_size * c + block_size * c + n_layer * per_block + 2 * c;
}

std::string GPTConfig::ToString() const {
  std::ostringstream s;
  s << "GPT(vocab_size=" << vocab_size << ", block_size=" << block_size
    << ", n_layer=" << n_layer << ", n_head=" << n_head << ", n_embd=" << n_embd
    << ", params=" << NumParams();
  if (dropout > 0) s << ", dropout=" << dropout;
  s << ")";
  return s.str();
}

namespace {

void InitLinear(torch::nn::Linear& linear, double std) {
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(linear->weight, 0.0, std);
  if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
}

// A LayerNorm computed in fp32 when the activations are bf16 or fp16 (under
// a mixed-precision policy), its output cast back, as PyTorch's autocast
// does with layer_norm. LibTorch 1.13's CPU layer_norm has no fast bf16
// kernel: forward and backward of an (8, 128, 256) bf16 input took 2.58 ms
// here, against 0.56 ms through fp32 with both casts. On a GPU, the
// LayerNorm of core/kernels (bf16 computed in fp32 inside the kernel).
at::Tensor Norm(torch::nn::LayerNorm& ln, const at::Tensor& x) {
  if (x.is_cuda()) return kernels::LayerNorm(x, ln->weight, ln->bias, ln->options.eps());
  const at::ScalarType type = x.scalar_type();
  if (type != at::kBFloat16 && type != at::kHalf) return ln->forward(x);
  const torch::nn::LayerNormOptions& o = ln->options;
  auto options = F::LayerNormFuncOptions(o.normalized_shape()).eps(o.eps());
  if (ln->weight.defined()) options.weight(ln->weight.to(at::kFloat));
  if (ln->bias.defined()) options.bias(ln->bias.to(at::kFloat));
  return F::layer_norm(x.to(at::kFloat), options).to(type);
}

}  // namespace

at::Tensor Dropout(const at::Tensor& x, double p, bool training) {
  if (p == 0 || !training) return x;
  return at::dropout(x, p, /*train=*/true);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& config)
    : head_dim_(config.n_embd / config.n_head), dropout_(config.dropout) {
  qkv = register_module(
      "qkv", torch::nn::Linear(config.n_embd, 3 * config.n_embd));
  proj = register_module("proj",
                         torch::nn::Linear(config.n_embd, config.n_embd));
  InitLinear(qkv, 0.02);
  // GPT-2: residual projections scaled by 1/sqrt(2 * n_layer).
  InitLinear(proj, 0.02 / std::sqrt(2.0 * config.n_layer));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t hd = head_dim_;
  at::Tensor qkv_all = tp::forward(qkv, x);  // [B, T, 3 * C_local]
  const int64_t C = qkv_all.size(2) / 3;     // this rank's q (k, v) width
  const int64_t H = C / hd;                  // this rank's heads
  auto qkv_out = qkv_all.split(C, /*dim=*/2);
  auto heads = [&](const at::Tensor& t) {
    return t.view({B, T, H, hd}).transpose(1, 2);  // [B, H, T, hd]
  };
  at::Tensor q = heads(qkv_out[0]), k = heads(qkv_out[1]),
             v = heads(qkv_out[2]);
  if (x.is_cuda() && (dropout_ == 0 || !is_training())) {
    // On a GPU, PyTorch's fused attention (flash or memory-efficient
    // kernels: no T x T matrix in memory); the same function as below.
    at::Tensor y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{},
                                                    /*dropout_p=*/0.0, /*is_causal=*/true)
                       .transpose(1, 2)
                       .contiguous()
                       .view({B, T, C});
    return tp::forward(proj, y);
  }
  at::Tensor att = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(hd));
  at::Tensor causal =
      at::ones({T, T}, x.options().dtype(at::kBool)).triu(/*diagonal=*/1);
  att = att.masked_fill(causal, -std::numeric_limits<double>::infinity());
  att = Dropout(at::softmax(att, /*dim=*/-1), dropout_, is_training());
  at::Tensor y = at::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
  return Dropout(tp::forward(proj, y), dropout_, is_training());
}

BlockImpl::BlockImpl(const GPTConfig& config) : dropout_(config.dropout) {
  ln1 = register_module(
      "ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  attn = register_module("attn", CausalSelfAttention(config));
  ln2 = register_module(
      "ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  fc = register_module("fc",
                       torch::nn::Linear(config.n_embd, 4 * config.n_embd));
  fc_proj = register_module(
      "fc_proj", torch::nn::Linear(4 * config.n_embd, config.n_embd));
  InitLinear(fc, 0.02);
  InitLinear(fc_proj, 0.02 / std::sqrt(2.0 * config.n_layer));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  if (x.is_cuda()) {
    // On a GPU the residual add and ln2 are one kernel.
    const kernels::AddNormResult h = kernels::AddLayerNorm(
        x, attn->forward(Norm(ln1, x)), ln2->weight, ln2->bias, ln2->options.eps());
    at::Tensor m = tp::forward(fc_proj, F::gelu(tp::forward(fc, h.normed)));
    return h.sum + Dropout(m, dropout_, is_training());
  }
  at::Tensor h = x + attn->forward(Norm(ln1, x));
  at::Tensor m = tp::forward(fc_proj, F::gelu(tp::forward(fc, Norm(ln2, h))));
  return h + Dropout(m, dropout_, is_training());
}

GPTImpl::GPTImpl(const GPTConfig& config) : config_(config) {
  config.Validate();
  wte = register_module("wte",
                        torch::nn::Embedding(config.vocab_size, config.n_embd));
  wpe = register_module("wpe",
                        torch::nn::Embedding(config.block_size, config.n_embd));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) blocks->push_back(Block(config));
  ln_f = register_module(
      "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd})));
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(wte->weight, 0.0, 0.02);
  torch::nn::init::normal_(wpe->weight, 0.0, 0.02);
}

tp::TensorParallelPlan GPTImpl::tensor_parallel_plan(int tp_size) const {
  if (tp_size < 1 || config_.n_head % tp_size != 0) {
    throw InvalidArgumentError(
        "GPT: tensor_parallel_size " + std::to_string(tp_size) +
        " does not divide n_head " + std::to_string(config_.n_head) +
        " (each tensor-parallel rank computes whole attention heads); choose "
        "a tensor_parallel_size that divides n_head");
  }
  using tp::ParallelStyle;
  return {{"blocks.*.attn.qkv", ParallelStyle::Colwise(false, /*fused_parts=*/3)},
          {"blocks.*.attn.proj", ParallelStyle::Rowwise()},
          {"blocks.*.fc", ParallelStyle::Colwise()},
          {"blocks.*.fc_proj", ParallelStyle::Rowwise()}};
}

Block GPTImpl::block(size_t i) const {
  return Block(blocks->ptr<BlockImpl>(i));
}

at::Tensor GPTImpl::forward(const at::Tensor& tokens) {
  return F::linear(hidden(tokens), wte->weight);  // LM head tied to the token embedding
}

at::Tensor GPTImpl::forward(const at::Tensor& tokens, const at::Tensor& targets) {
  if (!tokens.is_cuda()) return LanguageModelLoss(forward(tokens), targets);
  return kernels::LinearCrossEntropy(hidden(tokens), wte->weight, targets);
}

at::Tensor GPTImpl::hidden(const at::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  TORCH_CHECK(T <= config_.block_size, "GPT: sequence length ", T,
              " exceeds block_size ", config_.block_size);
  at::Tensor positions = at::arange(T, tokens.options().dtype(at::kLong));
  at::Tensor x = Dropout(wte->forward(tokens) + wpe->forward(positions),
                         config_.dropout, is_training());
  for (size_t i = 0; i < blocks->size(); ++i) x = fsdp::forward(block(i), x);
  return Norm(ln_f, x);
}

at::Tensor LanguageModelLoss(const at::Tensor& logits, const at::Tensor& targets) {
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                          targets.reshape({-1}));
}

}  // namespace models
}  // namespace fsdp2
