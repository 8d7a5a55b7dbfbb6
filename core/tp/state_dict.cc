#include "core/tp/state_dict.h"

#include <unordered_map>

#include "core/tp/parallelize.h"

namespace fsdp2 {
namespace tp {
namespace {

std::unordered_map<std::string, ShardedParameter> ByName(torch::nn::Module& root) {
  std::unordered_map<std::string, ShardedParameter> by_name;
  for (auto& p : sharded_parameters(root)) by_name.emplace(p.name, p);
  return by_name;
}

}  // namespace

void gather_tensor_parallel(torch::nn::Module& root, NamedTensors& state) {
  const auto by_name = ByName(root);
  for (auto& [name, value] : state) {
    auto it = by_name.find(name);
    if (it != by_name.end()) value = full_from_local(it->second, value);
  }
}

NamedTensors local_state_dict(torch::nn::Module& root, const NamedTensors& state) {
  const auto by_name = ByName(root);
  NamedTensors out;
  out.reserve(state.size());
  for (const auto& [name, value] : state) {
    auto it = by_name.find(name);
    out.emplace_back(name, it == by_name.end() ? value
                                               : local_from_full(it->second, value));
  }
  return out;
}

}  // namespace tp
}  // namespace fsdp2
