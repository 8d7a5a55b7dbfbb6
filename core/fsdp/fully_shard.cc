#include "core/fsdp/fully_shard.h"
#include "core/common/error.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

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
// The ignored ones found there go to `ignored_here`, each once.
void CollectParams(torch::nn::Module& module, const std::string& prefix,
                   const std::unordered_set<c10::TensorImpl*>& ignored,
                   std::vector<FSDPParam>& params,
                   std::unordered_map<c10::TensorImpl*, size_t>& by_impl,
                   std::vector<at::Tensor>& ignored_here) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    const at::Tensor& t = item.value();
    if (!t.defined()) continue;
    if (ignored.count(t.unsafeGetTensorImpl())) {
      auto same = [&](const at::Tensor& other) { return other.is_same(t); };
      if (std::none_of(ignored_here.begin(), ignored_here.end(), same)) {
        ignored_here.push_back(t);
      }
      continue;
    }
    auto [it, inserted] = by_impl.emplace(t.unsafeGetTensorImpl(), params.size());
    if (inserted) params.emplace_back(prefix + item.key(), t);
    params[it->second].add_slot(&module, item.key());
  }
  for (const auto& child : module.named_children()) {
    if (unit_of(*child.value())) continue;  // owned by an inner unit
    CollectParams(*child.value(), prefix + child.key() + ".", ignored, params,
                  by_impl, ignored_here);
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

// Throws std::invalid_argument for a negative prefetch depth (the divide
// factor and the reshard size are checked by FSDPParamGroup, before it
// shards anything).
void CheckPrefetch(const FSDPOptions& options) {
  if (options.forward_prefetch < 0 || options.backward_prefetch < 0) {
    throw InvalidArgumentError(
        "fully_shard: prefetch depths must be 0 or more, got forward_prefetch " +
        std::to_string(options.forward_prefetch) + ", backward_prefetch " +
        std::to_string(options.backward_prefetch));
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
  CheckPrefetch(options);
  std::unordered_set<c10::TensorImpl*> ignored;
  for (const at::Tensor& t : options.ignored_params) {
    ignored.insert(t.unsafeGetTensorImpl());
  }
  std::vector<FSDPParam> params;
  std::unordered_map<c10::TensorImpl*, size_t> by_impl;
  std::vector<at::Tensor> ignored_here;
  CollectParams(*module, "", ignored, params, by_impl, ignored_here);
  CheckNotOwnedElsewhere(*module, params);
  // An ignored parameter tied into an inner unit's part too is that unit's
  // to cast (units are sharded bottom-up).
  for (const auto& other : UnitRegistry::Get().live_units()) {
    for (const at::Tensor& t : other->ignored_params()) {
      ignored_here.erase(std::remove_if(ignored_here.begin(), ignored_here.end(),
                                        [&](const at::Tensor& mine) { return mine.is_same(t); }),
                         ignored_here.end());
    }
  }
  auto unit = std::make_shared<FSDPUnit>(module, options, std::move(params),
                                         std::move(ignored_here));
  UnitRegistry::Get().add(module, unit);
  return unit;
}

void set_requires_gradient_sync(torch::nn::Module& root, bool sync) {
  for (FSDPUnit* unit : UnitsUnder(root)) {
    unit->param_group().set_requires_gradient_sync(sync);
  }
}

void set_requires_all_reduce(torch::nn::Module& root, bool all_reduce) {
  for (FSDPUnit* unit : UnitsUnder(root)) {
    unit->param_group().set_requires_all_reduce(all_reduce);
  }
}

void set_gradient_divide_factor(torch::nn::Module& root, double factor) {
  for (FSDPUnit* unit : UnitsUnder(root)) {
    unit->param_group().set_gradient_divide_factor(factor);
  }
}

namespace {

FSDPUnit& UnitOrThrow(const torch::nn::Module& module, const char* what) {
  std::shared_ptr<FSDPUnit> unit = unit_of(module);
  if (!unit) {
    throw InvalidArgumentError(std::string("fsdp::") + what + ": module '" +
                               module.name() + "' is not sharded");
  }
  return *unit;
}

}  // namespace

UnshardHandle::UnshardHandle(std::weak_ptr<FSDPUnit> unit) : unit_(std::move(unit)) {}

void UnshardHandle::wait() {
  std::shared_ptr<FSDPUnit> unit = unit_.lock();
  unit_.reset();
  if (unit) unit->param_group().wait_unshard();
}

UnshardHandle unshard(const torch::nn::Module& module, bool async_op) {
  FSDPUnit& unit = UnitOrThrow(module, "unshard");
  if (unit.param_group().deferred()) {
    throw FailedPreconditionError(
        "fsdp::unshard: the parameters of '" + module.name() +
        "' are still on the meta device; materialize them first");
  }
  unit.param_group().unshard_async();
  UnshardHandle handle(unit.weak_from_this());
  if (!async_op) handle.wait();
  return handle;
}

void reshard(const torch::nn::Module& module) {
  UnitOrThrow(module, "reshard").param_group().reshard();
}

namespace {

void SetPrefetchList(const torch::nn::Module& module,
                     const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                     bool forward) {
  const char* what =
      forward ? "set_modules_to_forward_prefetch" : "set_modules_to_backward_prefetch";
  FSDPUnit& unit = UnitOrThrow(module, what);
  std::vector<std::weak_ptr<FSDPUnit>> units;
  std::unordered_set<const FSDPUnit*> seen;
  for (const auto& listed : modules) {
    if (!listed) throw InvalidArgumentError(std::string("fsdp::") + what + ": a module is null");
    FSDPUnit& target = UnitOrThrow(*listed, what);
    if (&target == &unit) {
      throw InvalidArgumentError(std::string("fsdp::") + what + ": module '" + module.name() +
                                 "' lists itself");
    }
    if (!seen.insert(&target).second) {
      throw InvalidArgumentError(std::string("fsdp::") + what + ": module '" +
                                 listed->name() + "' is listed twice");
    }
    units.push_back(target.weak_from_this());
  }
  unit.set_prefetch_list(forward, std::move(units));
}

}  // namespace

void set_modules_to_forward_prefetch(
    const torch::nn::Module& module,
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  SetPrefetchList(module, modules, /*forward=*/true);
}

void set_modules_to_backward_prefetch(
    const torch::nn::Module& module,
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  SetPrefetchList(module, modules, /*forward=*/false);
}

void check_prefetch_lists(torch::nn::Module& root) { CheckPrefetchLists(root); }

namespace {

// clip_grad_norm_ for gradients on a device: the same sums (in double), per
// group and split as there, as device tensors; the coefficient applied
// with one multi-tensor multiply; the norm read back once.
double DeviceClipGradNorm(const std::vector<at::Tensor>& grads,
                          std::vector<std::vector<at::Tensor>>& blocks,
                          std::vector<std::vector<at::Tensor>>& replicated,
                          const std::vector<std::shared_ptr<comm::ProcessGroup>>& groups,
                          const SplitParameters& split, bool any_split, double max_norm,
                          double norm_type) {
  at::NoGradGuard no_grad;
  const bool inf_norm = std::isinf(norm_type);
  const comm::ReduceOp op = inf_norm ? comm::ReduceOp::kMax : comm::ReduceOp::kSum;
  const at::TensorOptions options = grads[0].options().dtype(at::kDouble);
  blocks.resize(groups.size());
  replicated.resize(groups.size());
  // The sum of |g|^p (or the largest |g|) over `list`, a double on the device.
  auto partial = [&](const std::vector<at::Tensor>& list) {
    if (list.empty()) return at::zeros({}, options);
    std::vector<at::Tensor> norms = at::_foreach_norm(list, norm_type, at::kDouble);
    const at::Tensor n = at::stack(norms);
    return inf_norm ? n.max() : n.pow(norm_type).sum();
  };
  auto combine = [&](const at::Tensor& a, const at::Tensor& b) {
    return inf_norm ? at::maximum(a, b) : a + b;
  };
  std::vector<at::Tensor> block_sums;
  for (const auto& list : blocks) block_sums.push_back(partial(list));
  if (any_split && !block_sums.empty()) {
    at::Tensor t = at::stack(block_sums);
    split.group->all_reduce(t, op).wait();
    block_sums = t.unbind();
  }
  at::Tensor total = at::zeros({}, options);
  for (size_t i = 0; i < groups.size(); ++i) {
    at::Tensor sum = combine(block_sums[i], partial(replicated[i])).reshape({1});
    if (groups[i]) groups[i]->all_reduce(sum, op).wait();
    total = combine(total, sum.reshape({}));
  }
  const at::Tensor norm = inf_norm ? total : total.pow(1.0 / norm_type);
  const at::Tensor coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  // By dtype: the multiply takes one coefficient of each.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& g : grads) {
    if (g.numel() > 0) by_dtype[g.scalar_type()].push_back(g);
  }
  for (auto& [dtype, list] : by_dtype) at::_foreach_mul_(list, coef.to(dtype));
  return norm.item<double>();
}

}  // namespace

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
  // Gradients on a device (a GPU), by group: their norms are taken there,
  // a few multi-tensor kernels and no wait for the device but the last.
  std::vector<std::vector<at::Tensor>> device_blocks, device_replicated;
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
    if (!g.is_cpu()) {  // summed on the device below
      auto& lists = any_split && split.names.count(info.name) ? device_blocks : device_replicated;
      lists.resize(groups.size());
      lists[it - groups.begin()].push_back(g.detach());
      continue;
    }
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
  if (!grads.empty() && !grads[0].is_cpu()) {
    return DeviceClipGradNorm(grads, device_blocks, device_replicated, groups, split,
                              any_split, max_norm, norm_type);
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
    stats.sharded_grad_bytes += group.partial_grad_bytes();
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
