// fsdp2/core/strategy/fsdp_controls.h
//
// fully_shard's controls that FSDP2Strategy takes by name (its options
// ignored_params, forward_prefetch_modules, backward_prefetch_modules):
// resolving the names against the model, and the all-reduce of the ignored
// parameters' gradients. Their text forms (SplitNames, ParsePrefetchModules)
// are the option table's, which reads them (option_table.h).
#ifndef FSDP2_CORE_STRATEGY_FSDP_CONTROLS_H_
#define FSDP2_CORE_STRATEGY_FSDP_CONTROLS_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <map>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/strategy/option_table.h"

namespace fsdp2 {
namespace strategy {

// The parameters of `root` whose names match one of `patterns` (a name, or
// a glob over names: fnmatch without flags), each tensor once, in
// named_parameters() order. Throws std::invalid_argument naming a pattern
// that matches no parameter.
std::vector<at::Tensor> MatchParameters(torch::nn::Module& root,
                                        const std::vector<std::string>& patterns,
                                        const char* option);

// Throws std::invalid_argument unless every tensor of `matched` (from
// MatchParameters) is still a parameter of `root`: parallelize_fn (tensor
// parallelism) may have replaced one, which FSDP then sharded after all.
void RequireStillParameters(torch::nn::Module& root, const std::vector<at::Tensor>& matched,
                            const char* option);

// The module of `root` that named_modules() calls `name` ("" is `root`),
// which must be sharded (an FSDP unit). Throws std::invalid_argument naming
// `what` and the name: not a module of the model, or not sharded.
std::shared_ptr<torch::nn::Module> ShardedModuleByName(torch::nn::Module& root,
                                                       const std::string& name,
                                                       const std::string& what);

// fsdp::set_modules_to_{forward,backward}_prefetch for every entry, by
// named_modules() name, then fsdp::check_prefetch_lists(root). Throws
// std::invalid_argument naming an unknown or unsharded module.
void ApplyPrefetchModules(
    torch::nn::Module& root,
    const std::map<std::string, std::vector<std::string>>& forward,
    const std::map<std::string, std::vector<std::string>>& backward);

// Sums the gradients of `params` over `group` (null or size 1: none) and
// divides them by `divide_factor`; a parameter that got no gradient on any
// rank keeps none, one that got one somewhere gets the sum everywhere.
// Collective: every rank of `group` passes the same parameters.
void AllReduceGradients(const std::vector<at::Tensor>& params,
                        const std::shared_ptr<comm::ProcessGroup>& group,
                        double divide_factor);

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_FSDP_CONTROLS_H_
