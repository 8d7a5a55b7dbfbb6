#include "core/fsdp/fully_shard.h"
#include "core/common/error.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include "core/fsdp/deferred_init.h"
#include "core/fsdp/internal/buffer_pool.h"
#include "core/fsdp/internal/fsdp_param.h"
#include "core/fsdp/internal/fsdp_param_group.h"
#include "core/fsdp/internal/fsdp_unit.h"
#include "core/fsdp/internal/unit_registry.h"

namespace fsdp2 {
namespace fsdp {
namespace {

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
    if (inserted) params.emplace_back(prefix + item.key(), t);
    params[it->second].add_slot(&module, item.key());
  }
  for (const auto& child : module.named_children()) {
    if (unit_of(*child.value())) continue;  // owned by an inner unit
    CollectParams(*child.value(), prefix + child.key() + ".", params, by_impl);
  }
}

// Throws std::invalid_argument if one of `params` is tied to a parameter
// that a sharded module owns: it would be sharded twice.
void CheckNotOwnedElsewhere(const torch::nn::Module& module,
                            const std::vector<FSDPParam>& params) {
  for (const auto& unit : UnitRegistry::Get().live_units()) {
    for (const FSDPParam& owned : unit->param_group().params()) {
      for (const FSDPParam& p : params) {
        if (p.compute().unsafeGetTensorImpl() ==
            owned.compute().unsafeGetTensorImpl()) {
          throw InvalidArgumentError(
              "fully_shard: parameter '" + p.name() + "' of '" + module.name() +
              "' is tied to '" + owned.name() +
              "', which another sharded module owns; shard the modules "
              "that share a parameter as one unit");
        }
      }
    }
  }
}

// The FSDP parameter whose shard is `t`, and the unit that owns it.
std::pair<FSDPUnit*, const FSDPParam*> FindShard(
    const std::vector<FSDPUnit*>& units, const at::Tensor& t) {
  for (FSDPUnit* unit : units) {
    for (const FSDPParam& p : unit->param_group().params()) {
      if (p.shard().unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        return {unit, &p};
      }
    }
  }
  return {nullptr, nullptr};
}

// clip_grad_norm_ takes each gradient's norm in pieces of this many
// elements (512 KiB in double).
constexpr int64_t kNormPiece = int64_t{1} << 16;

}  // namespace

std::shared_ptr<FSDPUnit> unit_of(const torch::nn::Module& module) {
  return UnitRegistry::Get().find(module);
}

std::shared_ptr<FSDPUnit> fully_shard(
    const std::shared_ptr<torch::nn::Module>& module,
    const FSDPOptions& options) {
  if (!module) throw InvalidArgumentError("fully_shard: module is null");
  if (DeferredInitGuard::active()) {
    throw FailedPreconditionError(
        "fully_shard: called inside tensor_init_context(); leave the context "
        "first, then shard (parallelize) the model");
  }
  if (unit_of(*module)) {
    throw InvalidArgumentError("fully_shard: module '" + module->name() +
                                "' is already sharded; apply fully_shard "
                                "once per module");
  }
  std::vector<FSDPParam> params;
  std::unordered_map<c10::TensorImpl*, size_t> by_impl;
  CollectParams(*module, "", params, by_impl);
  CheckNotOwnedElsewhere(*module, params);
  auto unit = std::make_shared<FSDPUnit>(module, options, std::move(params));
  UnitRegistry::Get().add(module, unit);
  return unit;
}

void set_requires_gradient_sync(torch::nn::Module& root, bool sync) {
  for (FSDPUnit* unit : UnitsUnder(root)) {
    unit->param_group().set_requires_gradient_sync(sync);
  }
}

double clip_grad_norm_(torch::nn::Module& root, double max_norm,
                       double norm_type, const SplitParameters& split) {
  TORCH_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive");
  const bool inf_norm = std::isinf(norm_type);
  auto combine = [&](double a, double b) { return inf_norm ? std::max(a, b) : a + b; };
  const comm::ReduceOp op = inf_norm ? comm::ReduceOp::kMax : comm::ReduceOp::kSum;
  const bool any_split = split.group && split.group->size() > 1;

  // Partial norms per shard group (null: this rank holds whole tensors),
  // split blocks apart from the rest. The groups follow from the model's
  // structure, so every rank lists the same ones in the same order.
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups;
  std::vector<double> blocks, replicated;
  std::vector<at::Tensor> grads;
  std::unordered_set<const c10::TensorImpl*> seen;  // tied: counted once
  for (const auto& info : shard_info(root, /*world_rank=*/0)) {
    if (!seen.insert(info.shard.unsafeGetTensorImpl()).second) continue;
    auto it = std::find(groups.begin(), groups.end(), info.group);
    if (it == groups.end()) {
      groups.push_back(info.group);
      blocks.push_back(0);
      replicated.push_back(0);
      it = groups.end() - 1;
    }
    const at::Tensor& g = info.shard.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (g.numel() == 0) continue;
    // In double, a piece at a time: a whole shard's double copies would be
    // the step's memory peak (three of the largest shard, 28 MiB per rank
    // on the 85M GPT at N = 2). A shard of one piece sums as before.
    const at::Tensor flat = g.detach().reshape({-1});
    double part = 0;
    for (int64_t start = 0; start < flat.numel(); start += kNormPiece) {
      const at::Tensor gd =
          flat.narrow(0, start, std::min(kNormPiece, flat.numel() - start))
              .to(at::kDouble, /*non_blocking=*/false, /*copy=*/true)
              .abs_();
      part = combine(part, inf_norm ? gd.max().item<double>()
                                    : gd.pow_(norm_type).sum().item<double>());
    }
    const size_t i = it - groups.begin();
    double& acc = any_split && split.names.count(info.name) ? blocks[i]
                                                            : replicated[i];
    acc = combine(acc, part);
  }
  // One all-reduce of the block sums over the split group, then one per
  // shard group.
  if (any_split && !blocks.empty()) {
    at::Tensor t = at::tensor(blocks, at::kDouble);
    split.group->all_reduce(t, op).wait();
    blocks.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  double total = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    double sum = combine(blocks[i], replicated[i]);
    if (groups[i]) {
      at::Tensor t = at::full({1}, sum, at::kDouble);
      groups[i]->all_reduce(t, op).wait();
      sum = t.item<double>();
    }
    total = combine(total, sum);
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
    const FSDPParamGroup& group = unit->param_group();
    for (const FSDPParam& p : group.params()) {
      stats.sharded_param_bytes += p.shard().nbytes();
      if (p.shard().grad().defined()) {
        stats.sharded_grad_bytes += p.shard().grad().nbytes();
      }
      stats.total_param_numel += p.global_numel();
    }
    stats.unsharded_param_bytes += group.unsharded_bytes();
    stats.unsharded_grad_bytes += group.unsharded_grad_bytes();
  }
  return stats;
}

int64_t peak_unsharded_param_bytes() { return PeakUnshardedBytes(); }
void reset_peak_unsharded_param_bytes() { ResetPeakUnshardedBytes(); }

BufferPoolStats buffer_pool_stats() { return internal::BufferPool::Get().stats(); }
void release_buffer_pool() { internal::BufferPool::Get().release(); }

CommWaitStats comm_wait_stats(const torch::nn::Module& module) {
  auto unit = unit_of(module);
  if (!unit) {
    throw InvalidArgumentError("comm_wait_stats: module '" + module.name() +
                                "' is not sharded; pass a module that "
                                "fully_shard was applied to");
  }
  return unit->param_group().comm_wait_stats();
}

void reset_comm_wait_stats(torch::nn::Module& root) {
  for (FSDPUnit* unit : UnitsUnder(root)) {
    unit->param_group().reset_comm_wait_stats();
  }
}

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
        throw InvalidArgumentError("load_full_state_dict: unexpected key '" +
                                    name + "'");
      }
      continue;
    }
    seen[std::find(keys.begin(), keys.end(), name) - keys.begin()] = true;
    auto [unit, p] = FindShard(units, *target);
    const auto expected = p ? p->global_shape() : target->sizes().vec();
    if (value.sizes().vec() != expected) {
      throw InvalidArgumentError(
          "load_full_state_dict: '" + name + "' has shape " +
          c10::str(value.sizes()) + " but the model expects " +
          c10::str(at::IntArrayRef(expected)));
    }
    if (p == nullptr) {
      copies.emplace_back(*target, value);
    } else {
      copies.emplace_back(p->shard(),
                          p->local_rows_of(value).reshape(p->shard().sizes()));
    }
  }
  if (strict) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (!seen[i]) {
        throw InvalidArgumentError("load_full_state_dict: missing key '" +
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
      info.global_shape = p->global_shape();
      info.rows = p->rows();
      info.row_start = p->row_start();
      info.local_rows = p->local_rows();
      info.primary = unit->param_group().primary_replica();
      info.group = unit->param_group().shard_group();
      info.shard_rows = p->shard_rows();
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

namespace internal {

FSDPUnit* FindUnit(const torch::nn::Module* module) {
  return module ? UnitRegistry::Get().find(*module).get() : nullptr;
}

void PreForward(FSDPUnit* unit) {
  CheckNotInCheckpointedRegion(unit->module());
  unit->pre_forward();
}
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
