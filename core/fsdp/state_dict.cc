#include "core/fsdp/state_dict.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/common/error.h"
#include "core/fsdp/internal/fsdp_param.h"
#include "core/fsdp/internal/fsdp_param_group.h"
#include "core/fsdp/internal/fsdp_unit.h"
#include "core/fsdp/internal/unit_registry.h"

namespace fsdp2 {
namespace fsdp {
namespace {

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

}  // namespace

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

}  // namespace fsdp
}  // namespace fsdp2
