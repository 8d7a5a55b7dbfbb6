// fsdp2/core/fsdp/internal/unit_registry.h
//
// UnitRegistry: which unit fully_shard() made of which module, for
// unit_of() and fsdp::forward(). It owns the units.
//
// Entries are keyed by the module's address but hold the module weakly
// (PyTorch keys module state weakly too): every lookup checks that the
// module that was sharded is still alive, so a new module built at a dead
// one's address never picks up the dead module's unit. Entries of dead
// modules are dropped when a lookup meets them and at each registration.
//
// Internal to core/fsdp. Thread-safe (one mutex); units themselves are not.
#ifndef FSDP2_CORE_FSDP_INTERNAL_UNIT_REGISTRY_H_
#define FSDP2_CORE_FSDP_INTERNAL_UNIT_REGISTRY_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <torch/nn/module.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace fsdp2 {
namespace fsdp {

class FSDPUnit;

class UnitRegistry {
 public:
  static UnitRegistry& Get();  // the process's registry; never destroyed

  // The unit of `module`, or null (also when the module that was sharded at
  // this address has died).
  std::shared_ptr<FSDPUnit> find(const torch::nn::Module& module);
  // Registers `unit` as `module`'s. Throws std::invalid_argument when the
  // module already has one.
  void add(const std::shared_ptr<torch::nn::Module>& module,
           std::shared_ptr<FSDPUnit> unit);
  // Every unit whose module is alive.
  std::vector<std::shared_ptr<FSDPUnit>> live_units();

 private:
  struct Entry {
    std::weak_ptr<torch::nn::Module> module;
    std::shared_ptr<FSDPUnit> unit;
  };
  std::mutex mu_;
  std::unordered_map<const torch::nn::Module*, Entry> entries_;
};

// Every unit in `root`'s module tree (root included), in module order.
std::vector<FSDPUnit*> UnitsUnder(torch::nn::Module& root);

// The units of `root`'s module tree (root included), each once, in two
// orders every rank derives alike from the model's structure:
//  - pre: a module before the modules inside it, children in registration
//    order (the order a forward that calls them in that order enters them);
//  - backward: a depth-first walk with the children in reverse, each unit
//    listed when the walk enters it (entered = true) and when it leaves it:
//    the order in which such a forward's backward enters units (their
//    pre-backward) and finishes them (their gradients are complete).
struct UnitTreeOrder {
  std::vector<FSDPUnit*> pre;
  std::vector<std::pair<FSDPUnit*, bool>> backward;
};
UnitTreeOrder UnitsInTreeOrder(torch::nn::Module& root);

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_UNIT_REGISTRY_H_
