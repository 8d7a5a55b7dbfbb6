#include "core/fsdp/fully_shard.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "core/fsdp/deferred_init.h"
#include "core/fsdp/fsdp_unit.h"

namespace fsdp2 {
namespace fsdp {

int64_t PeakUnshardedBytes();  // fsdp_unit.cc
void ResetPeakUnshardedBytes();

namespace {

// Which module each unit belongs to. Units live as long as their entry; an
// entry whose module has died is dropped on the next registration.
struct Registry {
  std::mutex mu;
  std::unordered_map<const torch::nn::Module*, std::shared_ptr<FSDPUnit>> units;
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

// Collects the parameters `module` owns: its own and its descendants', except
// those under modules that are already sharded. Tied parameters (one tensor
// registered in several places) become one FSDPParam with several slots.
void CollectParams(torch::nn::Module& module, const std::string& prefix,
                   std::vector<FSDPParam>& params,
                   std::unordered_map<c10::TensorImpl*, size_t>& by_impl) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    const at::Tensor& t = item.value();
    if (!t.defined()) continue;
    auto [it, inserted] = by_impl.emplace(t.unsafeGetTensorImpl(), params.size());
    if (inserted) {
      FSDPParam p;
      p.name = prefix + item.key();
      p.compute = t;
      params.push_back(std::move(p));
    }
    auto& slots = params[it->second].slots;
    std::pair<torch::nn::Module*, std::string> slot{&module, item.key()};
    if (std::find(slots.begin(), slots.end(), slot) == slots.end()) {
      slots.push_back(slot);
    }
  }
  for (const auto& child : module.named_children()) {
    if (unit_of(*child.value())) continue;  // owned by an inner unit
    CollectParams(*child.value(), prefix + child.key() + ".", params, by_impl);
  }
}

}  // namespace

const char* ToString(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard: return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard: return "NO_SHARD";
    case ShardingStrategy::kHybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

ShardingStrategy ParseShardingStrategy(const std::string& name) {
  std::string key;
  for (char c : name) key += c == '-' ? '_' : static_cast<char>(std::tolower(c));
  if (key == "full_shard") return ShardingStrategy::kFullShard;
  if (key == "shard_grad_op") return ShardingStrategy::kShardGradOp;
  if (key == "no_shard") return ShardingStrategy::kNoShard;
  if (key == "hybrid_shard") return ShardingStrategy::kHybridShard;
  throw std::invalid_argument("unknown sharding strategy '" + name +
                              "' (expected full_shard, shard_grad_op, "
                              "no_shard or hybrid_shard)");
}

std::shared_ptr<FSDPUnit> unit_of(const torch::nn::Module& module) {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  auto it = registry.units.find(&module);
  return it == registry.units.end() ? nullptr : it->second;
}

std::shared_ptr<FSDPUnit> fully_shard(
    const std::shared_ptr<torch::nn::Module>& module,
    const FSDPOptions& options) {
  if (!module) throw std::invalid_argument("fully_shard: module is null");
  if (DeferredInitGuard::active()) {
    throw std::logic_error(
        "fully_shard: called inside tensor_init_context(); leave the context "
        "first, then shard (parallelize) the model");
  }
  Registry& registry = GetRegistry();
  {
    std::lock_guard<std::mutex> lock(registry.mu);
    for (auto it = registry.units.begin(); it != registry.units.end();) {
      it = it->second->module_alive() ? std::next(it)
                                      : registry.units.erase(it);
    }
    if (registry.units.count(module.get())) {
      throw std::invalid_argument("fully_shard: module '" + module->name() +
                                  "' is already sharded; apply fully_shard "
                                  "once per module");
    }
  }
  std::vector<FSDPParam> params;
  std::unordered_map<c10::TensorImpl*, size_t> by_impl;
  CollectParams(*module, "", params, by_impl);
  {
    // A parameter tied to one that an inner unit owns would be sharded twice.
    std::lock_guard<std::mutex> lock(registry.mu);
    for (const auto& entry : registry.units) {
      for (const auto& owned : entry.second->params()) {
        for (const auto& p : params) {
          if (p.compute.unsafeGetTensorImpl() ==
              owned.compute.unsafeGetTensorImpl()) {
            throw std::invalid_argument(
                "fully_shard: parameter '" + p.name + "' of '" +
                module->name() + "' is tied to '" + owned.name +
                "', which another sharded module owns; shard the modules "
                "that share a parameter as one unit");
          }
        }
      }
    }
  }
  auto unit = std::make_shared<FSDPUnit>(module, options, std::move(params));
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.units[module.get()] = unit;
  return unit;
}

void set_requires_gradient_sync(torch::nn::Module& root, bool sync) {
  for (FSDPUnit* unit : UnitsUnder(root)) unit->set_requires_gradient_sync(sync);
}

double clip_grad_norm_(torch::nn::Module& root, double max_norm,
                       double norm_type) {
  TORCH_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive");
  const bool inf_norm = std::isinf(norm_type);
  // Partial norms per shard group, in unit order (the same on every rank).
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups;
  std::vector<double> partial;
  std::vector<at::Tensor> grads;
  double local_only = 0;
  for (FSDPUnit* unit : UnitsUnder(root)) {
    double sum = 0;
    for (const auto& p : unit->params()) {
      const at::Tensor& g = p.shard.grad();
      if (!g.defined() || g.numel() == 0) continue;
      grads.push_back(g);
      at::Tensor gd = g.detach().to(at::kDouble).abs();
      sum = inf_norm ? std::max(sum, gd.max().item<double>())
                     : sum + gd.pow(norm_type).sum().item<double>();
    }
    const auto& group = unit->shard_group();
    if (!group) {
      local_only = inf_norm ? std::max(local_only, sum) : local_only + sum;
      continue;
    }
    auto it = std::find(groups.begin(), groups.end(), group);
    if (it == groups.end()) {
      groups.push_back(group);
      partial.push_back(sum);
    } else {
      double& acc = partial[it - groups.begin()];
      acc = inf_norm ? std::max(acc, sum) : acc + sum;
    }
  }
  double total = local_only;
  for (size_t i = 0; i < groups.size(); ++i) {
    at::Tensor t = at::full({1}, partial[i], at::kDouble);
    groups[i]->all_reduce(t, inf_norm ? comm::ReduceOp::kMax : comm::ReduceOp::kSum)
        .wait();
    total = inf_norm ? std::max(total, t.item<double>()) : total + t.item<double>();
  }
  const double norm = inf_norm ? total : std::pow(total, 1.0 / norm_type);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    for (auto& g : grads) g.mul_(coef);
  }
  return norm;
}

MemoryStats memory_stats(torch::nn::Module& root) {
  MemoryStats stats;
  for (FSDPUnit* unit : UnitsUnder(root)) {
    for (const auto& p : unit->params()) {
      stats.sharded_param_bytes += p.shard.nbytes();
      if (p.shard.grad().defined()) {
        stats.sharded_grad_bytes += p.shard.grad().nbytes();
      }
      int64_t numel = 1;
      for (int64_t d : p.global_shape) numel *= d;
      stats.total_param_numel += numel;
    }
    stats.unsharded_param_bytes += unit->unsharded_bytes();
    stats.unsharded_grad_bytes += unit->unsharded_grad_bytes();
  }
  return stats;
}

namespace {

// The FSDP parameter whose shard is `t`, and the unit that owns it.
std::pair<FSDPUnit*, const FSDPParam*> FindShard(
    const std::vector<FSDPUnit*>& units, const at::Tensor& t) {
  for (FSDPUnit* unit : units) {
    for (const auto& p : unit->params()) {
      if (p.shard.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        return {unit, &p};
      }
    }
  }
  return {nullptr, nullptr};
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> full_state_dict(
    torch::nn::Module& root) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& info : shard_info(root, /*world_rank=*/0)) {
    out.emplace_back(info.name, gather_rows(info, info.shard));
  }
  return out;
}

void load_full_state_dict(
    torch::nn::Module& root,
    const std::vector<std::pair<std::string, at::Tensor>>& state, bool strict) {
  at::NoGradGuard no_grad;
  const auto units = UnitsUnder(root);
  auto params = root.named_parameters(/*recurse=*/true);
  const std::vector<std::string> keys = params.keys();
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (target, source)
  std::vector<bool> seen(params.size(), false);
  for (const auto& [name, value] : state) {
    const at::Tensor* target = params.find(name);
    if (target == nullptr) {
      if (strict) {
        throw std::invalid_argument("load_full_state_dict: unexpected key '" +
                                    name + "'");
      }
      continue;
    }
    seen[std::find(keys.begin(), keys.end(), name) - keys.begin()] = true;
    auto [unit, p] = FindShard(units, *target);
    const auto expected = p ? p->global_shape : target->sizes().vec();
    if (value.sizes().vec() != expected) {
      throw std::invalid_argument(
          "load_full_state_dict: '" + name + "' has shape " +
          c10::str(value.sizes()) + " but the model expects " +
          c10::str(at::IntArrayRef(expected)));
    }
    if (p == nullptr) {
      copies.emplace_back(*target, value);
    } else {
      copies.emplace_back(
          p->shard, value.reshape({p->rows, p->row_numel})
                        .narrow(0, p->row_start, p->local_rows)
                        .reshape(p->shard.sizes()));
    }
  }
  if (strict) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (!seen[i]) {
        throw std::invalid_argument("load_full_state_dict: missing key '" +
                                    keys[i] + "'");
      }
    }
  }
  for (auto& [target, source] : copies) target.copy_(source);
}

std::vector<ShardInfo> shard_info(torch::nn::Module& root, int world_rank) {
  const auto units = UnitsUnder(root);
  std::vector<ShardInfo> out;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    ShardInfo info;
    info.name = item.key();
    info.shard = item.value();
    auto [unit, p] = FindShard(units, item.value());
    if (p == nullptr) {  // replicated on every rank
      info.global_shape = item.value().sizes().vec();
      info.rows = item.value().dim() == 0 ? 1 : item.value().size(0);
      info.local_rows = info.rows;
      info.shard_rows = info.rows;
      info.primary = world_rank == 0;
    } else {
      info.global_shape = p->global_shape;
      info.rows = p->rows;
      info.row_start = p->row_start;
      info.local_rows = p->local_rows;
      info.primary = unit->primary_replica();
      info.group = unit->shard_group();
      info.shard_rows = p->shard_rows;
    }
    out.push_back(std::move(info));
  }
  return out;
}

at::Tensor gather_rows(const ShardInfo& info, const at::Tensor& local) {
  at::NoGradGuard no_grad;
  int64_t width = 1;
  for (size_t d = 1; d < info.global_shape.size(); ++d) width *= info.global_shape[d];
  if (!info.group) return local.detach().reshape(info.global_shape).clone();
  const int64_t world = info.group->size();
  at::Tensor padded = at::zeros({info.shard_rows * width}, local.options());
  padded.narrow(0, 0, info.local_rows * width).copy_(local.detach().reshape({-1}));
  at::Tensor gathered = at::empty({world * info.shard_rows * width}, local.options());
  info.group->all_gather_into_flat(gathered, padded).wait();
  return gathered.narrow(0, 0, info.rows * width).view(info.global_shape);
}

int64_t peak_unsharded_param_bytes() { return PeakUnshardedBytes(); }
void reset_peak_unsharded_param_bytes() { ResetPeakUnshardedBytes(); }

namespace internal {

FSDPUnit* FindUnit(const torch::nn::Module* module) {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  auto it = registry.units.find(module);
  return it == registry.units.end() ? nullptr : it->second.get();
}

void PreForward(FSDPUnit* unit) { unit->pre_forward(); }
at::Tensor CastInput(FSDPUnit* unit, const at::Tensor& t) {
  return unit->cast_input(t);
}
std::vector<at::Tensor> PostForward(FSDPUnit* unit,
                                    std::vector<at::Tensor> outputs) {
  return unit->post_forward(std::move(outputs));
}
void AbortForward(FSDPUnit* unit) { unit->abort_forward(); }

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2
