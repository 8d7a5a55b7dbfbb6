#include "core/models/llama.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <limits>
#include <string>

#include "core/common/error.h"
#include "core/fsdp/fully_shard.h"
#include "core/tp/parallelize.h"

namespace fsdp2 {
namespace models {
namespace F = torch::nn::functional;

namespace {

// transformers' default initializer_range.
constexpr double kInitStd = 0.02;

void CheckSizes(const HfLlamaConfig& c) {
  auto positive = [&](int64_t v, const char* field) {
    if (v < 1) {
      throw InvalidArgumentError(std::string("Llama config: ") + field + " = " +
                                 std::to_string(v) + " must be positive");
    }
  };
  positive(c.vocab_size, "vocab_size");
  positive(c.hidden_size, "hidden_size");
  positive(c.intermediate_size, "intermediate_size");
  positive(c.num_hidden_layers, "num_hidden_layers");
  positive(c.num_attention_heads, "num_attention_heads");
  positive(c.num_key_value_heads, "num_key_value_heads");
  positive(c.head_dim, "head_dim");
  if (c.num_attention_heads % c.num_key_value_heads != 0 || c.head_dim % 2 != 0) {
    throw InvalidArgumentError(
        "Llama config: num_key_value_heads (" + std::to_string(c.num_key_value_heads) +
        ") must divide num_attention_heads (" + std::to_string(c.num_attention_heads) +
        ") and head_dim (" + std::to_string(c.head_dim) + ") must be even");
  }
  if (!c.sliding_window.empty() &&
      static_cast<int64_t>(c.sliding_window.size()) != c.num_hidden_layers) {
    throw InvalidArgumentError("Llama config: " + std::to_string(c.sliding_window.size()) +
                               " sliding windows for " +
                               std::to_string(c.num_hidden_layers) + " layers");
  }
}

torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) {
  torch::nn::Linear linear(torch::nn::LinearOptions(in, out).bias(bias));
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(linear->weight, 0.0, kInitStd);
  if (bias) torch::nn::init::zeros_(linear->bias);
  return linear;
}

// One LoRA factor: a [out, in] weight without bias, named as PEFT names
// it (lora_A.weight, lora_B.weight). lora_A also carries the adapter's
// scaling and dropout, plain numbers that no checkpoint holds.
class LoraFactorImpl : public torch::nn::Module {
 public:
  LoraFactorImpl(int64_t in, int64_t out, double scaling, double dropout)
      : scaling(scaling), dropout(dropout) {
    weight = register_parameter("weight", torch::empty({out, in}));
  }
  at::Tensor weight;
  double scaling, dropout;
};
TORCH_MODULE(LoraFactor);

// linear(x) through tp::forward, plus (alpha / rank) * B A dropout(x) when
// the projection has adapters: its only children, lora_A then lora_B
// (LlamaForCausalLMImpl::add_lora). children() of a plain projection is an
// empty vector, so the check costs no allocation on the hot path.
at::Tensor Project(const torch::nn::Linear& linear, const at::Tensor& x) {
  at::Tensor y = tp::forward(linear, x);
  const auto children = linear->children();
  if (children.empty()) return y;
  const auto* lora_a = children.at(0)->as<LoraFactorImpl>();
  const auto* lora_b = children.at(1)->as<LoraFactorImpl>();
  at::Tensor in = x;
  if (lora_a->dropout > 0 && linear->is_training()) {
    in = F::dropout(in, F::DropoutFuncOptions().p(lora_a->dropout).training(true));
  }
  return y + F::linear(F::linear(in, lora_a->weight), lora_b->weight) * lora_a->scaling;
}

// [B, T] true where a new run of equal segment values starts (column 0
// always).
at::Tensor RunStarts(const at::Tensor& segments) {
  const int64_t T = segments.size(1);
  at::Tensor starts = at::ones_like(segments, segments.options().dtype(at::kBool));
  if (T > 1) {
    starts.narrow(1, 1, T - 1)
        .copy_(segments.narrow(1, 1, T - 1).ne(segments.narrow(1, 0, T - 1)));
  }
  return starts;
}

// [B, T, heads * hd] -> [B, heads, T, hd].
at::Tensor Heads(const at::Tensor& t, int64_t hd) {
  return t.view({t.size(0), t.size(1), -1, hd}).transpose(1, 2);
}

// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) over the
// two halves of the head dimension (transformers' convention).
at::Tensor Rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

// Each key/value head serves `groups` consecutive query heads.
at::Tensor RepeatKv(const at::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const int64_t B = x.size(0), KV = x.size(1), T = x.size(2), hd = x.size(3);
  return x.unsqueeze(2).expand({B, KV, groups, T, hd}).reshape({B, KV * groups, T, hd});
}

// [T, T] true where query q may attend to key k: k <= q, and k > q - window
// when window > 0.
at::Tensor AllowedMask(int64_t T, int64_t window, c10::Device device) {
  const at::Tensor q = at::arange(T, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor k = q.unsqueeze(0);
  at::Tensor allowed = k <= q.unsqueeze(1);
  if (window > 0) allowed = allowed.logical_and(k > q.unsqueeze(1) - window);
  return allowed;
}

}  // namespace

RMSNormImpl::RMSNormImpl(int64_t size, double eps) : eps_(eps) {
  // empty + ones_, as stock modules build theirs (deferred initialisation
  // replays the in-place fill).
  weight = register_parameter("weight", torch::empty({size}));
  torch::NoGradGuard no_grad;
  torch::nn::init::ones_(weight);
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::ScalarType type = x.scalar_type();
  // float32 as transformers computes it (float64 stays float64).
  at::Tensor u = x.to(at::promote_types(type, at::kFloat));
  const at::Tensor variance = u.pow(2).mean(-1, /*keepdim=*/true);
  u = u * at::rsqrt(variance + eps_);
  return weight * u.to(type);
}

LlamaAttentionImpl::LlamaAttentionImpl(const HfLlamaConfig& c, int64_t layer)
    : head_dim_(c.head_dim),
      window_(c.sliding_window.empty() ? 0 : c.sliding_window[layer]) {
  const int64_t q_width = c.num_attention_heads * c.head_dim;
  const int64_t kv_width = c.num_key_value_heads * c.head_dim;
  q_proj = register_module("q_proj", MakeLinear(c.hidden_size, q_width, c.qkv_bias));
  k_proj = register_module("k_proj", MakeLinear(c.hidden_size, kv_width, c.qkv_bias));
  v_proj = register_module("v_proj", MakeLinear(c.hidden_size, kv_width, c.qkv_bias));
  o_proj = register_module("o_proj", MakeLinear(q_width, c.hidden_size, c.o_bias));
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                       const at::Tensor& sin, const AttentionMask& mask) {
  const int64_t B = x.size(0), T = x.size(1), hd = head_dim_;
  const at::Tensor q = Rotate(Heads(Project(q_proj, x), hd), cos, sin);
  const at::Tensor k_heads = Rotate(Heads(Project(k_proj, x), hd), cos, sin);
  const at::Tensor v_heads = Heads(Project(v_proj, x), hd);
  // This rank's heads (all of them without tensor parallelism).
  const int64_t H = q.size(1), groups = H / k_heads.size(1);
  const at::Tensor k = RepeatKv(k_heads, groups), v = RepeatKv(v_heads, groups);
  // head_dim ** -0.5, as transformers writes it.
  const double scale = std::pow(static_cast<double>(hd), -0.5);
  const bool windowed = window_ > 0 && window_ < T;
  const bool segmented = mask.allowed.defined();
  at::Tensor y;
  if (x.is_cuda()) {
    // PyTorch's fused attention; an explicit mask only where a window
    // cuts into the causal one or documents are packed.
    c10::optional<at::Tensor> allowed;
    if (windowed || segmented) {
      allowed = AllowedMask(T, window_, x.device());
      if (segmented) allowed = allowed->logical_and(mask.allowed);
    }
    y = at::scaled_dot_product_attention(q, k, v, allowed, /*dropout_p=*/0.0,
                                         /*is_causal=*/!allowed.has_value(), scale);
  } else {
    // transformers' eager attention: scores * head_dim^-0.5, masked,
    // softmax in float32 (float64 stays float64) and cast back.
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;
    at::Tensor allowed = AllowedMask(T, window_, x.device());
    if (segmented) allowed = allowed.logical_and(mask.allowed);
    scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
    const at::ScalarType type = q.scalar_type();
    y = at::matmul(at::softmax(scores, -1, at::promote_types(type, at::kFloat)).to(type), v);
  }
  return Project(o_proj, y.transpose(1, 2).contiguous().view({B, T, H * hd}));
}

LlamaMLPImpl::LlamaMLPImpl(const HfLlamaConfig& c) {
  gate_proj = register_module(
      "gate_proj", MakeLinear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj",
                            MakeLinear(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module(
      "down_proj", MakeLinear(c.intermediate_size, c.hidden_size, c.mlp_bias));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  return Project(down_proj, F::silu(Project(gate_proj, x)) * Project(up_proj, x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const HfLlamaConfig& c, int64_t layer) {
  self_attn = register_module("self_attn", LlamaAttention(c, layer));
  mlp = register_module("mlp", LlamaMLP(c));
  input_layernorm =
      register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                          const at::Tensor& sin, const AttentionMask& mask) {
  const at::Tensor h = x + self_attn->forward(input_layernorm->forward(x), cos, sin, mask);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

LlamaModelImpl::LlamaModelImpl(const HfLlamaConfig& c) {
  auto options = torch::nn::EmbeddingOptions(c.vocab_size, c.hidden_size);
  const bool padded = c.pad_token_id && *c.pad_token_id >= 0 && *c.pad_token_id < c.vocab_size;
  if (padded) options.padding_idx(*c.pad_token_id);
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(options));
  {
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(embed_tokens->weight, 0.0, kInitStd);
    if (padded) embed_tokens->weight[*c.pad_token_id].zero_();
  }
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(c, i));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const HfLlamaConfig& config) : config_(config) {
  CheckSizes(config_);
  model = register_module("model", LlamaModel(config_));
  if (!config_.tie_word_embeddings) {
    lm_head = register_module("lm_head",
                              MakeLinear(config_.hidden_size, config_.vocab_size, false));
  }
}

LlamaDecoderLayer LlamaForCausalLMImpl::layer(size_t i) const {
  return LlamaDecoderLayer(model->layers->ptr<LlamaDecoderLayerImpl>(i));
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& tokens, const at::Tensor& segments) {
  const at::Tensor x = hidden(tokens, segments);
  if (lm_head) return tp::forward(lm_head, x);
  return F::linear(x, model->embed_tokens->weight);
}

at::Tensor LlamaForCausalLMImpl::hidden(const at::Tensor& tokens, const at::Tensor& segments) {
  at::Tensor x = model->embed_tokens->forward(tokens);
  auto rotary = RotaryTables(config_, tokens.size(1), x.scalar_type(), x.device());
  AttentionMask mask;
  if (segments.defined()) {
    const int64_t B = tokens.size(0), T = tokens.size(1);
    if (!segments.sizes().equals(tokens.sizes())) {
      throw InvalidArgumentError("Llama: segments must have the shape of tokens [" +
                                 std::to_string(B) + ", " + std::to_string(T) + "]");
    }
    // Each row's positions restart at its documents' starts: the tables'
    // rows gathered per token, [B, 1, T, head_dim] for the heads.
    const at::Tensor on_device = segments.to(x.device());
    const at::Tensor positions = SegmentPositions(on_device);
    auto per_row = [&](const at::Tensor& table) {
      return table.index_select(0, positions.reshape({-1})).view({B, T, -1}).unsqueeze(1);
    };
    rotary = {per_row(rotary.first), per_row(rotary.second)};
    mask = SegmentMask(on_device);
  }
  for (size_t i = 0; i < model->layers->size(); ++i) {
    x = fsdp::forward(layer(i), x, rotary.first, rotary.second, mask);
  }
  return model->norm->forward(x);
}

void LlamaForCausalLMImpl::add_lora(const LoraOptions& lora) {
  if (lora_.rank > 0) throw InvalidArgumentError("LoRA: the model has adapters already");
  CheckLora(lora);
  for (const at::Tensor& p : parameters()) p.set_requires_grad(false);
  for (size_t i = 0; i < model->layers->size(); ++i) {
    LlamaDecoderLayer l = layer(i);
    const std::map<std::string, torch::nn::Linear> projections = {
        {"q_proj", l->self_attn->q_proj},   {"k_proj", l->self_attn->k_proj},
        {"v_proj", l->self_attn->v_proj},   {"o_proj", l->self_attn->o_proj},
        {"gate_proj", l->mlp->gate_proj},   {"up_proj", l->mlp->up_proj},
        {"down_proj", l->mlp->down_proj}};
    for (const std::string& t : lora.target_modules) {
      torch::nn::Linear linear = projections.at(t);
      if (!linear->children().empty()) continue;  // named twice
      const int64_t in = linear->weight.size(1), out = linear->weight.size(0);
      // Built as the base weights were (float32, or deferred under
      // tensor_init_context()); a later Module::to converts them alike.
      auto a = LoraFactor(in, lora.rank, lora.scaling(), lora.dropout);
      auto b = LoraFactor(lora.rank, out, lora.scaling(), lora.dropout);
      {
        torch::NoGradGuard no_grad;
        // PEFT's init: A Kaiming-uniform with a = sqrt(5) (nn.Linear's own),
        // B zero, so the adapted model starts as the base model.
        torch::nn::init::kaiming_uniform_(a->weight, std::sqrt(5.0));
        torch::nn::init::zeros_(b->weight);
      }
      linear->register_module("lora_A", a);
      linear->register_module("lora_B", b);
    }
  }
  lora_ = lora;
}

tp::TensorParallelPlan LlamaForCausalLMImpl::tensor_parallel_plan(int tp_size) const {
  const HfLlamaConfig& c = config_;
  if (lora_.rank > 0 && tp_size > 1) {
    throw InvalidArgumentError(
        "Llama: LoRA adapters with tensor_parallel_size " + std::to_string(tp_size) +
        " are not supported: train LoRA with data parallelism (tensor_parallel_size 1)");
  }
  if (tp_size < 1 || c.num_attention_heads % tp_size != 0 ||
      c.num_key_value_heads % tp_size != 0 || c.intermediate_size % tp_size != 0) {
    throw InvalidArgumentError(
        "Llama: tensor_parallel_size " + std::to_string(tp_size) +
        " must divide num_attention_heads (" + std::to_string(c.num_attention_heads) +
        "), num_key_value_heads (" + std::to_string(c.num_key_value_heads) +
        ") and intermediate_size (" + std::to_string(c.intermediate_size) +
        "): each tensor-parallel rank computes whole heads");
  }
  using tp::ParallelStyle;
  return {{"model.layers.*.self_attn.q_proj", ParallelStyle::Colwise()},
          {"model.layers.*.self_attn.k_proj", ParallelStyle::Colwise()},
          {"model.layers.*.self_attn.v_proj", ParallelStyle::Colwise()},
          {"model.layers.*.self_attn.o_proj", ParallelStyle::Rowwise()},
          {"model.layers.*.mlp.gate_proj", ParallelStyle::Colwise()},
          {"model.layers.*.mlp.up_proj", ParallelStyle::Colwise()},
          {"model.layers.*.mlp.down_proj", ParallelStyle::Rowwise()}};
}

at::Tensor SegmentPositions(const at::Tensor& segments) {
  at::NoGradGuard no_grad;
  const at::Tensor index = at::arange(segments.size(1), segments.options().dtype(at::kLong))
                               .unsqueeze(0)
                               .expand(segments.sizes());
  // The start index where a run starts; a running maximum carries it along
  // the run.
  const at::Tensor start =
      std::get<0>(at::cummax(index * RunStarts(segments).to(at::kLong), 1));
  return index - start;
}

AttentionMask SegmentMask(const at::Tensor& segments) {
  at::NoGradGuard no_grad;
  // Run ids rather than the values, so two documents with equal ids that
  // are not neighbours stay apart.
  const at::Tensor run = RunStarts(segments).to(at::kLong).cumsum(1);
  return {run.unsqueeze(2).eq(run.unsqueeze(1)).unsqueeze(1)};
}

void CheckLora(const LoraOptions& lora) {
  if (lora.rank < 1 || !(lora.alpha > 0) || !(lora.dropout >= 0 && lora.dropout < 1)) {
    throw InvalidArgumentError("LoRA: lora_rank (" + std::to_string(lora.rank) +
                               ") must be at least 1, lora_alpha (" +
                               std::to_string(lora.alpha) + ") positive and lora_dropout (" +
                               std::to_string(lora.dropout) + ") in [0, 1)");
  }
  if (lora.target_modules.empty()) {
    throw InvalidArgumentError("LoRA: lora_target_modules is empty (known: q_proj, k_proj, "
                               "v_proj, o_proj, gate_proj, up_proj, down_proj)");
  }
  const auto& known = LoraTargetNames();
  for (const std::string& t : lora.target_modules) {
    if (std::find(known.begin(), known.end(), t) == known.end()) {
      throw InvalidArgumentError("LoRA: lora_target_modules names \"" + t +
                                 "\", which is no module of the Llama family's decoder "
                                 "layers (known: q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                 "up_proj, down_proj)");
    }
  }
}

const std::vector<std::string>& LoraTargetNames() {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

std::pair<at::Tensor, at::Tensor> RotaryTables(const HfLlamaConfig& config, int64_t T,
                                               at::ScalarType dtype, c10::Device device) {
  at::NoGradGuard no_grad;
  // float32 as transformers computes it (float64 for a float64 model).
  const at::ScalarType compute = at::promote_types(dtype, at::kFloat);
  const at::Tensor inv_freq = RopeInvFreq(config).to(device).to(compute);
  const at::Tensor positions =
      at::arange(T, at::TensorOptions().dtype(at::kLong).device(device)).to(compute);
  // freqs[t, i] = position t * inv_freq[i]: one float32 product, as
  // transformers' K = 1 matmul gives it.
  const at::Tensor freqs = positions.unsqueeze(1) * inv_freq.unsqueeze(0);
  const at::Tensor angles = at::cat({freqs, freqs}, -1);
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

std::vector<std::pair<std::string, std::vector<int64_t>>> LlamaParameterShapes(
    const HfLlamaConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  const int64_t H = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, I = c.intermediate_size;
  shapes.push_back({"model.embed_tokens.weight", {c.vocab_size, H}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
      shapes.push_back({p + name + ".weight", {out, in}});
      if (bias) shapes.push_back({p + name + ".bias", {out}});
    };
    linear("self_attn.q_proj", H, q, c.qkv_bias);
    linear("self_attn.k_proj", H, kv, c.qkv_bias);
    linear("self_attn.v_proj", H, kv, c.qkv_bias);
    linear("self_attn.o_proj", q, H, c.o_bias);
    linear("mlp.gate_proj", H, I, c.mlp_bias);
    linear("mlp.up_proj", H, I, c.mlp_bias);
    linear("mlp.down_proj", I, H, c.mlp_bias);
    shapes.push_back({p + "input_layernorm.weight", {H}});
    shapes.push_back({p + "post_attention_layernorm.weight", {H}});
  }
  shapes.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) shapes.push_back({"lm_head.weight", {c.vocab_size, H}});
  return shapes;
}

}  // namespace models
}  // namespace fsdp2
