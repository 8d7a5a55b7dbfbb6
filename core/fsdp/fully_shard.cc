#include "core/fsdp/fully_shard.h"
#include "core/common/error.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "core/fsdp/deferred_init.h"
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

void set_host_gradient_sink(torch::nn::Module& root, HostGradientSink sink) {
  for (FSDPUnit* unit : UnitsUnder(root)) unit->param_group().set_host_gradient_sink(sink);
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
