// fsdp2/core/fsdp/unit_plan.h
//
// UnitPlanProvider: a model that names the modules FSDP shards as units of
// their own, in place of the reference parallelize_fn's rule (every child of
// every torch::nn::ModuleList, then the root). A TorchScript model
// (core/script) implements it: its submodules are the script's, and its
// wrapping policy names them by class or path.
#ifndef FSDP2_CORE_FSDP_UNIT_PLAN_H_
#define FSDP2_CORE_FSDP_UNIT_PLAN_H_

#include <torch/nn/module.h>

#include <memory>
#include <vector>

namespace fsdp2 {
namespace fsdp {

class UnitPlanProvider {
 public:
  virtual ~UnitPlanProvider() = default;
  // The modules to shard before the root, each after every module inside
  // it (bottom-up). The root itself is not listed: it is sharded last.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> fsdp_unit_plan() = 0;
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_UNIT_PLAN_H_
