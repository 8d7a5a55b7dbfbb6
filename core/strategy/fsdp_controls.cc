#include "core/strategy/fsdp_controls.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <fnmatch.h>

#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/fsdp/fully_shard.h"
#include "core/strategy/fsdp2_strategy.h"

namespace fsdp2 {
namespace strategy {

std::vector<at::Tensor> MatchParameters(torch::nn::Module& root,
                                        const std::vector<std::string>& patterns,
                                        const char* option) {
  std::vector<at::Tensor> matched;
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<bool> used(patterns.size(), false);
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    bool match = false;
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (patterns[i] == item.key() ||
          fnmatch(patterns[i].c_str(), item.key().c_str(), 0) == 0) {
        used[i] = true;
        match = true;
      }
    }
    if (match && seen.insert(item.value().unsafeGetTensorImpl()).second) {
      matched.push_back(item.value());
    }
  }
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (!used[i]) {
      throw InvalidArgumentError(std::string("FSDP2Strategy: ") + option + " pattern '" +
                                 patterns[i] + "' matches no parameter of the model");
    }
  }
  return matched;
}

void RequireStillParameters(torch::nn::Module& root, const std::vector<at::Tensor>& matched,
                            const char* option) {
  std::unordered_set<const c10::TensorImpl*> params;
  for (const at::Tensor& p : root.parameters(/*recurse=*/true)) {
    params.insert(p.unsafeGetTensorImpl());
  }
  for (const at::Tensor& t : matched) {
    if (!params.count(t.unsafeGetTensorImpl())) {
      throw InvalidArgumentError(
          std::string("FSDP2Strategy: a parameter named by ") + option +
          " was replaced while the model was parallelized (tensor parallelism splits "
          "its layers' parameters), so it could not be kept out of sharding; ignore "
          "parameters outside the tensor-parallel plan or use tensor_parallel_size 1");
    }
  }
}

namespace {

std::shared_ptr<torch::nn::Module> FindSharded(
    const std::unordered_map<std::string, std::shared_ptr<torch::nn::Module>>& by_name,
    const std::string& name, const std::string& what) {
  auto it = by_name.find(name);
  if (it == by_name.end() || !fsdp::unit_of(*it->second)) {
    throw InvalidArgumentError(
        "FSDP2Strategy: " + what + " names '" + name + "', which is " +
        (it == by_name.end() ? "not a module of the model" : "not a sharded module (an FSDP unit)") +
        "; names are the model's named_modules() names of sharded modules, \"\" the root");
  }
  return it->second;
}

std::unordered_map<std::string, std::shared_ptr<torch::nn::Module>> ModulesByName(
    torch::nn::Module& root) {
  std::unordered_map<std::string, std::shared_ptr<torch::nn::Module>> by_name;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    by_name.emplace(item.key(), item.value());
  }
  return by_name;
}

}  // namespace

std::shared_ptr<torch::nn::Module> ShardedModuleByName(torch::nn::Module& root,
                                                       const std::string& name,
                                                       const std::string& what) {
  return FindSharded(ModulesByName(root), name, what);
}

void ApplyPrefetchModules(
    torch::nn::Module& root,
    const std::map<std::string, std::vector<std::string>>& forward,
    const std::map<std::string, std::vector<std::string>>& backward) {
  if (forward.empty() && backward.empty()) return;
  const auto by_name = ModulesByName(root);
  auto find = [&](const std::string& name, const char* option) {
    return FindSharded(by_name, name, option);
  };
  for (const bool is_forward : {true, false}) {
    const char* option = is_forward ? "forward_prefetch_modules" : "backward_prefetch_modules";
    for (const auto& [name, targets] : is_forward ? forward : backward) {
      std::shared_ptr<torch::nn::Module> module = find(name, option);
      std::vector<std::shared_ptr<torch::nn::Module>> listed;
      for (const std::string& target : targets) listed.push_back(find(target, option));
      if (is_forward) {
        fsdp::set_modules_to_forward_prefetch(*module, listed);
      } else {
        fsdp::set_modules_to_backward_prefetch(*module, listed);
      }
    }
  }
  fsdp::check_prefetch_lists(root);
}

void AllReduceGradients(const std::vector<at::Tensor>& params,
                        const std::shared_ptr<comm::ProcessGroup>& group,
                        double divide_factor) {
  if (params.empty()) return;
  at::NoGradGuard no_grad;
  std::vector<bool> touched(params.size());
  if (group && group->size() > 1) {
    // Which parameters got a gradient on some rank: the others keep none.
    at::Tensor flags = at::empty({static_cast<int64_t>(params.size())},
                                 params[0].options().dtype(at::kFloat));
    for (size_t i = 0; i < params.size(); ++i) {
      flags[static_cast<int64_t>(i)].fill_(params[i].grad().defined() ? 1.0 : 0.0);
    }
    group->all_reduce(flags).wait();
    at::Tensor host = flags.cpu();
    for (size_t i = 0; i < params.size(); ++i) {
      touched[i] = host[static_cast<int64_t>(i)].item<float>() > 0;
      if (!touched[i]) continue;
      at::Tensor param = params[i];
      if (!param.grad().defined()) param.mutable_grad() = at::zeros_like(param);
      group->all_reduce(param.grad()).wait();
    }
  } else {
    for (size_t i = 0; i < params.size(); ++i) touched[i] = params[i].grad().defined();
  }
  if (divide_factor == 1.0) return;
  for (size_t i = 0; i < params.size(); ++i) {
    if (touched[i]) params[i].grad().div_(divide_factor);
  }
}

}  // namespace strategy
}  // namespace fsdp2
