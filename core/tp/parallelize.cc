#include "core/tp/parallelize.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "core/fsdp/fully_shard.h"
#include "core/tp/collectives.h"

namespace fsdp2 {
namespace tp {

std::string ParallelStyle::ToString() const {
  std::ostringstream s;
  if (kind == Kind::kColwise) {
    s << "Colwise(gather_output=" << gather_output
      << ", fused_parts=" << fused_parts << ")";
  } else {
    s << "Rowwise(input_is_sharded=" << input_is_sharded << ")";
  }
  return s.str();
}

namespace {

enum class LayerType { kLinear, kEmbedding };

// What parallelize_module did to one module.
struct Layer {
  LayerType type = LayerType::kLinear;
  std::string path;  // as the plan matched it, for messages
  ParallelStyle style;
  std::shared_ptr<comm::ProcessGroup> group;
  std::weak_ptr<torch::nn::Module> alive;
  int64_t rank = 0;
  int64_t size = 1;
  // (registered name, split dim, fused parts, full shape) per split tensor.
  std::vector<ShardedParameter> params;
  int64_t local_rows = 0;  // row-wise Embedding: token ids per rank
  int64_t local_in = 0;    // row-wise Linear: input features per rank
};

struct Registry {
  std::mutex mu;
  std::unordered_map<const torch::nn::Module*, std::shared_ptr<Layer>> layers;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

std::shared_ptr<Layer> FindLayer(const torch::nn::Module* module) {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  auto it = registry.layers.find(module);
  if (it == registry.layers.end() || it->second->alive.expired()) return nullptr;
  return it->second;
}

std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '.')) parts.push_back(part);
  return parts;
}

bool Matches(const std::string& pattern, const std::string& path) {
  const auto want = Split(pattern), have = Split(path);
  if (want.size() != have.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != "*" && want[i] != have[i]) return false;
  }
  return true;
}

// The view of `t` with `dim` split into (parts, tp, rest).
std::vector<int64_t> SplitShape(const std::vector<int64_t>& shape, int64_t dim,
                                int64_t parts, int64_t tp) {
  std::vector<int64_t> out(shape.begin(), shape.begin() + dim);
  out.push_back(parts);
  out.push_back(tp);
  out.push_back(shape[dim] / parts / tp);
  out.insert(out.end(), shape.begin() + dim + 1, shape.end());
  return out;
}

at::Tensor Block(const at::Tensor& full, int64_t dim, int64_t parts, int64_t tp,
                 int64_t rank) {
  std::vector<int64_t> local = full.sizes().vec();
  local[dim] /= tp;
  return full.reshape(SplitShape(full.sizes().vec(), dim, parts, tp))
      .select(dim + 1, rank)
      .reshape(local)
      .clone(at::MemoryFormat::Contiguous);
}

void CheckEven(const std::string& path, const char* what, int64_t size,
               int64_t parts, int64_t tp) {
  if (size % parts != 0 || (size / parts) % tp != 0) {
    std::ostringstream s;
    s << "parallelize_module: '" << path << "': " << what << " " << size;
    if (parts > 1) s << " (" << parts << " fused parts of " << size / parts << ")";
    s << " cannot be split evenly over tensor_parallel_size " << tp
      << "; choose a tensor_parallel_size that divides "
      << (parts > 1 ? size / parts : size);
    throw InvalidArgumentError(s.str());
  }
}

// Replaces `param` by its block, keeping the tensor object.
void Shrink(at::Tensor& param, ShardedParameter& p, int64_t rank) {
  at::NoGradGuard no_grad;
  p.full_shape = param.sizes().vec();
  param.set_data(Block(param.detach(), p.dim, p.fused_parts,
                       p.group ? p.group->size() : 1, rank));
}

std::shared_ptr<Layer> ApplyLinear(torch::nn::LinearImpl& linear, Layer layer) {
  const int64_t tp = layer.size;
  const int64_t out = linear.weight.size(0), in = linear.weight.size(1);
  const bool colwise = layer.style.kind == ParallelStyle::Kind::kColwise;
  if (layer.style.fused_parts < 1 || (!colwise && layer.style.fused_parts != 1)) {
    throw InvalidArgumentError("parallelize_module: '" + layer.path +
                                "': fused_parts must be 1 for a row-wise split "
                                "and positive for a column-wise one");
  }
  if (colwise) {
    CheckEven(layer.path, "out_features", out, layer.style.fused_parts, tp);
  } else {
    CheckEven(layer.path, "in_features", in, 1, tp);
    layer.local_in = in / tp;
  }
  ShardedParameter w;
  w.name = "weight";
  w.dim = colwise ? 0 : 1;
  w.fused_parts = layer.style.fused_parts;
  w.group = layer.group;
  Shrink(linear.weight, w, layer.rank);
  layer.params.push_back(w);
  if (colwise && linear.bias.defined()) {
    ShardedParameter b = w;
    b.name = "bias";
    Shrink(linear.bias, b, layer.rank);
    layer.params.push_back(b);
  }
  return std::make_shared<Layer>(std::move(layer));
}

std::shared_ptr<Layer> ApplyEmbedding(torch::nn::EmbeddingImpl& embedding,
                                      Layer layer) {
  const auto& o = embedding.options;
  if (o.max_norm().has_value() || o.sparse()) {
    throw InvalidArgumentError(
        "parallelize_module: '" + layer.path +
        "': an Embedding with max_norm or sparse gradients cannot be split; "
        "unset them or leave this module out of the plan");
  }
  const bool colwise = layer.style.kind == ParallelStyle::Kind::kColwise;
  if (!colwise && o.padding_idx().has_value()) {
    throw InvalidArgumentError(
        "parallelize_module: '" + layer.path +
        "': a row-wise (vocab-parallel) Embedding does not support padding_idx; "
        "use a column-wise split or unset padding_idx");
  }
  if (layer.style.fused_parts != 1) {
    throw InvalidArgumentError("parallelize_module: '" + layer.path +
                                "': fused_parts applies to Linear only");
  }
  const int64_t rows = embedding.weight.size(0), dims = embedding.weight.size(1);
  CheckEven(layer.path, colwise ? "embedding_dim" : "num_embeddings",
            colwise ? dims : rows, 1, layer.size);
  layer.local_rows = rows / layer.size;
  ShardedParameter w;
  w.name = "weight";
  w.dim = colwise ? 1 : 0;
  w.group = layer.group;
  Shrink(embedding.weight, w, layer.rank);
  layer.params.push_back(w);
  return std::make_shared<Layer>(std::move(layer));
}

at::Tensor ForwardLinear(const Layer& layer, torch::nn::LinearImpl& linear,
                         const at::Tensor& x) {
  const auto& g = layer.group;
  if (layer.style.kind == ParallelStyle::Kind::kColwise) {
    at::Tensor y = at::linear(copy_to_tensor_parallel(x, g), linear.weight,
                              linear.bias);
    if (!layer.style.gather_output) return y;
    y = gather_from_tensor_parallel(y, g, -1);  // [..., tp * parts * m]
    const int64_t parts = layer.style.fused_parts;
    if (parts == 1) return y;
    // Rank-major [tp, parts, m] back to the module's [parts, tp, m] order.
    std::vector<int64_t> shape = y.sizes().vec();
    std::vector<int64_t> split(shape.begin(), shape.end() - 1);
    split.insert(split.end(), {layer.size, parts, shape.back() / layer.size / parts});
    return y.view(split).transpose(-3, -2).reshape(shape);
  }
  at::Tensor in = layer.style.input_is_sharded
                      ? x
                      : scatter_to_tensor_parallel(x, g, -1);
  if (in.size(-1) != layer.local_in) {
    throw InvalidArgumentError(
        "tp::forward: row-wise '" + layer.path + "' expects " +
        std::to_string(layer.local_in) + " input features per rank, got " +
        std::to_string(in.size(-1)) + (layer.style.input_is_sharded
            ? "; feed it the sharded output of a column-wise layer, or use "
              "Rowwise(/*input_is_sharded=*/false) for a replicated input"
            : ""));
  }
  at::Tensor y = reduce_from_tensor_parallel(at::linear(in, linear.weight), g);
  return linear.bias.defined() ? y + linear.bias : y;
}

at::Tensor ForwardEmbedding(const Layer& layer,
                            torch::nn::EmbeddingImpl& embedding,
                            const at::Tensor& ids) {
  const auto& g = layer.group;
  if (layer.style.kind == ParallelStyle::Kind::kColwise) {
    const int64_t padding = embedding.options.padding_idx().value_or(-1);
    at::Tensor y = at::embedding(embedding.weight, ids, padding);
    return layer.style.gather_output ? gather_from_tensor_parallel(y, g, -1) : y;
  }
  const int64_t start = layer.rank * layer.local_rows;
  at::Tensor outside = (ids < start).logical_or(ids >= start + layer.local_rows);
  at::Tensor local_ids = (ids - start).masked_fill(outside, 0);
  at::Tensor y = at::embedding(embedding.weight, local_ids)
                     .masked_fill(outside.unsqueeze(-1), 0);
  return reduce_from_tensor_parallel(y, g);
}

}  // namespace

void parallelize_module(const std::shared_ptr<torch::nn::Module>& root,
                        const std::shared_ptr<comm::ProcessGroup>& group,
                        const TensorParallelPlan& plan) {
  if (!root) throw InvalidArgumentError("parallelize_module: module is null");
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules{
      {"", root}};
  for (const auto& item : root->named_modules("", /*include_self=*/false)) {
    modules.emplace_back(item.key(), item.value());
  }
  for (const auto& [path, m] : modules) {
    if (fsdp::unit_of(*m)) {
      throw InvalidArgumentError(
          "parallelize_module: '" + (path.empty() ? root->name() : path) +
          "' is already FSDP-sharded; apply tensor parallelism first, then "
          "fully_shard");
    }
  }
  // Resolve the whole plan before changing anything.
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, Layer>> todo;
  for (const auto& entry : plan) {
    bool matched = false;
    for (const auto& [path, m] : modules) {
      if (!Matches(entry.pattern, path)) continue;
      matched = true;
      const bool linear = dynamic_cast<torch::nn::LinearImpl*>(m.get()) != nullptr;
      const bool embedding =
          dynamic_cast<torch::nn::EmbeddingImpl*>(m.get()) != nullptr;
      if (!linear && !embedding) {
        throw InvalidArgumentError(
            "parallelize_module: plan entry '" + entry.pattern + "' names '" +
            path + "', a " + m->name() +
            "; tensor-parallel styles apply to Linear and Embedding only");
      }
      if (is_tensor_parallel(*m)) {
        throw InvalidArgumentError("parallelize_module: '" + path +
                                    "' is already tensor-parallel");
      }
      for (const auto& other : todo) {
        if (other.first == m) {
          throw InvalidArgumentError("parallelize_module: '" + path +
                                      "' matches two plan entries");
        }
      }
      Layer layer;
      layer.type = linear ? LayerType::kLinear : LayerType::kEmbedding;
      layer.path = path;
      layer.style = entry.style;
      layer.group = group;
      layer.alive = m;
      layer.rank = group ? group->rank() : 0;
      layer.size = group ? group->size() : 1;
      todo.emplace_back(m, std::move(layer));
    }
    if (!matched) {
      throw InvalidArgumentError("parallelize_module: plan entry '" +
                                  entry.pattern +
                                  "' matches no module of the model");
    }
  }
  // Check every split before the first one changes a parameter.
  for (const auto& [m, layer] : todo) {
    const int64_t tp = layer.size;
    const bool colwise = layer.style.kind == ParallelStyle::Kind::kColwise;
    if (auto* l = dynamic_cast<torch::nn::LinearImpl*>(m.get())) {
      if (colwise) {
        CheckEven(layer.path, "out_features", l->weight.size(0),
                  std::max<int64_t>(layer.style.fused_parts, 1), tp);
      } else {
        CheckEven(layer.path, "in_features", l->weight.size(1), 1, tp);
      }
    } else {
      auto* e = dynamic_cast<torch::nn::EmbeddingImpl*>(m.get());
      CheckEven(layer.path, colwise ? "embedding_dim" : "num_embeddings",
                e->weight.size(colwise ? 1 : 0), 1, tp);
    }
  }
  std::vector<std::pair<const torch::nn::Module*, std::shared_ptr<Layer>>> done;
  for (auto& [m, layer] : todo) {
    std::shared_ptr<Layer> applied =
        layer.type == LayerType::kLinear
            ? ApplyLinear(*dynamic_cast<torch::nn::LinearImpl*>(m.get()), layer)
            : ApplyEmbedding(*dynamic_cast<torch::nn::EmbeddingImpl*>(m.get()),
                             layer);
    done.emplace_back(m.get(), std::move(applied));
  }
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  for (auto it = registry.layers.begin(); it != registry.layers.end();) {
    it = it->second->alive.expired() ? registry.layers.erase(it) : std::next(it);
  }
  for (auto& [m, layer] : done) registry.layers[m] = std::move(layer);
}

bool is_tensor_parallel(const torch::nn::Module& module) {
  return FindLayer(&module) != nullptr;
}

std::vector<ShardedParameter> sharded_parameters(torch::nn::Module& root) {
  std::vector<ShardedParameter> out;
  auto add = [&](const std::string& path, const torch::nn::Module& m) {
    auto layer = FindLayer(&m);
    if (!layer) return;
    for (ShardedParameter p : layer->params) {
      p.name = path.empty() ? p.name : path + "." + p.name;
      out.push_back(std::move(p));
    }
  };
  add("", root);
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    add(item.key(), *item.value());
  }
  return out;
}

at::Tensor full_from_local(const ShardedParameter& p, const at::Tensor& local) {
  at::NoGradGuard no_grad;
  if (!p.group || p.group->size() == 1) return local.detach().clone();
  const int64_t tp = p.group->size();
  at::Tensor gathered = all_gather_along(local, *p.group, p.dim);
  // Gathered blocks are rank-major: [tp, parts, m] along dim.
  std::vector<int64_t> rank_major(p.full_shape.begin(), p.full_shape.begin() + p.dim);
  rank_major.insert(rank_major.end(),
                    {tp, p.fused_parts, p.full_shape[p.dim] / p.fused_parts / tp});
  rank_major.insert(rank_major.end(), p.full_shape.begin() + p.dim + 1,
                    p.full_shape.end());
  return gathered.view(rank_major)
      .transpose(p.dim, p.dim + 1)
      .reshape(p.full_shape)
      .clone(at::MemoryFormat::Contiguous);
}

at::Tensor local_from_full(const ShardedParameter& p, const at::Tensor& full) {
  if (full.sizes().vec() != p.full_shape) {
    throw InvalidArgumentError(
        "tensor parallel: '" + p.name + "' has shape " + c10::str(full.sizes()) +
        " but the model expects " + c10::str(at::IntArrayRef(p.full_shape)));
  }
  at::NoGradGuard no_grad;
  const int64_t tp = p.group ? p.group->size() : 1;
  return Block(full.detach(), p.dim, p.fused_parts, tp, p.group ? p.group->rank() : 0);
}

namespace internal {

at::Tensor Forward(torch::nn::Module* module, const at::Tensor& x) {
  auto layer = FindLayer(module);
  if (!layer) return at::Tensor();
  if (layer->type == LayerType::kLinear) {
    return ForwardLinear(*layer, *dynamic_cast<torch::nn::LinearImpl*>(module), x);
  }
  return ForwardEmbedding(*layer, *dynamic_cast<torch::nn::EmbeddingImpl*>(module), x);
}

}  // namespace internal
}  // namespace tp
}  // namespace fsdp2
