#include "core/fsdp/internal/unit_registry.h"
#include "core/common/error.h"

#include <algorithm>
#include <functional>
#include <stdexcept>

namespace fsdp2 {
namespace fsdp {
namespace {

// Whether `entry` still describes the module at `address`.
template <typename Entry>
bool Alive(const Entry& entry, const torch::nn::Module* address) {
  auto module = entry.module.lock();
  return module && module.get() == address;
}

}  // namespace

UnitRegistry& UnitRegistry::Get() {
  static UnitRegistry* registry = new UnitRegistry();
  return *registry;
}

std::shared_ptr<FSDPUnit> UnitRegistry::find(const torch::nn::Module& module) {
  std::shared_ptr<FSDPUnit> dead;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(&module);
  if (it == entries_.end()) return nullptr;
  if (Alive(it->second, &module)) return it->second.unit;
  dead = std::move(it->second.unit);
  entries_.erase(it);
  return nullptr;
}

void UnitRegistry::add(const std::shared_ptr<torch::nn::Module>& module,
                       std::shared_ptr<FSDPUnit> unit) {
  std::vector<std::shared_ptr<FSDPUnit>> dead;  // destroyed after the lock
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (Alive(it->second, it->first)) {
      ++it;
    } else {
      dead.push_back(std::move(it->second.unit));
      it = entries_.erase(it);
    }
  }
  if (entries_.count(module.get())) {
    throw InvalidArgumentError("fully_shard: module '" + module->name() +
                                "' is already sharded; apply fully_shard "
                                "once per module");
  }
  entries_[module.get()] = Entry{module, std::move(unit)};
}

std::vector<std::shared_ptr<FSDPUnit>> UnitRegistry::live_units() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<FSDPUnit>> units;
  for (const auto& [address, entry] : entries_) {
    if (Alive(entry, address)) units.push_back(entry.unit);
  }
  return units;
}

std::vector<FSDPUnit*> UnitsUnder(torch::nn::Module& root) {
  UnitRegistry& registry = UnitRegistry::Get();
  std::vector<FSDPUnit*> units;
  for (const auto& m : root.modules(/*include_self=*/true)) {
    if (auto unit = registry.find(*m)) units.push_back(unit.get());
  }
  return units;
}

namespace {

// Depth-first over `module`'s tree, a module shared by several parents at
// its first place only: visit(unit, true) when the walk enters a unit's
// module, visit(unit, false) when it leaves it; the children in
// registration order, or with `reverse` in reverse.
void WalkUnits(torch::nn::Module& module, UnitRegistry& registry, bool reverse,
               std::unordered_set<const torch::nn::Module*>& seen,
               const std::function<void(FSDPUnit*, bool)>& visit) {
  if (!seen.insert(&module).second) return;
  std::shared_ptr<FSDPUnit> unit = registry.find(module);
  if (unit) visit(unit.get(), true);
  auto children = module.children();
  if (reverse) std::reverse(children.begin(), children.end());
  for (const auto& child : children) WalkUnits(*child, registry, reverse, seen, visit);
  if (unit) visit(unit.get(), false);
}

}  // namespace

UnitTreeOrder UnitsInTreeOrder(torch::nn::Module& root) {
  UnitTreeOrder order;
  UnitRegistry& registry = UnitRegistry::Get();
  std::unordered_set<const torch::nn::Module*> seen;
  WalkUnits(root, registry, /*reverse=*/false, seen, [&](FSDPUnit* unit, bool entered) {
    if (entered) order.pre.push_back(unit);
  });
  seen.clear();
  WalkUnits(root, registry, /*reverse=*/true, seen, [&](FSDPUnit* unit, bool entered) {
    order.backward.emplace_back(unit, entered);
  });
  return order;
}

}  // namespace fsdp
}  // namespace fsdp2
