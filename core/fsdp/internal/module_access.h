// fsdp2/core/fsdp/internal/module_access.h
//
// Write access to a module's registered parameters. torch::nn::Module keeps
// them in a protected dictionary and offers no way to replace one; fully_shard
// must replace each with its local shard so that named_parameters() and
// optimizers see shards.
#ifndef FSDP2_CORE_FSDP_INTERNAL_MODULE_ACCESS_H_
#define FSDP2_CORE_FSDP_INTERNAL_MODULE_ACCESS_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <torch/nn/module.h>

namespace fsdp2 {
namespace fsdp {
namespace internal {

struct ModuleAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& Parameters(
      torch::nn::Module& m) {
    return m.*(&ModuleAccess::parameters_);
  }
};

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_MODULE_ACCESS_H_
