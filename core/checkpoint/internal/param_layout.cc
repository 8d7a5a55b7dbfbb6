#include "core/checkpoint/internal/param_layout.h"

#include <ATen/ATen.h>

#include <unordered_map>

#include "core/checkpoint/internal/optimizer_state.h"

namespace fsdp2 {
namespace checkpoint {
namespace internal {

std::vector<ParamLayout> ParamLayouts(torch::nn::Module& root, int world_rank) {
  std::unordered_map<std::string, tp::ShardedParameter> split;
  int tp_rank = 0;
  for (auto& p : tp::sharded_parameters(root)) {
    if (p.group) tp_rank = p.group->rank();
    split.emplace(p.name, p);
  }
  std::vector<ParamLayout> out;
  for (auto& info : fsdp::shard_info(root, world_rank)) {
    ParamLayout l;
    auto it = split.find(info.name);
    if (it != split.end()) {
      l.tp = it->second;
      l.full_shape = it->second.full_shape;
    } else {
      l.full_shape = info.global_shape;
      l.writes_rows = info.primary && tp_rank == 0;
    }
    l.shard = std::move(info);
    out.push_back(std::move(l));
  }
  return out;
}

at::Tensor GatherFull(const ParamLayout& layout, const at::Tensor& local) {
  at::Tensor block = fsdp::gather_rows(layout.shard, local);
  return layout.tp ? tp::full_from_local(*layout.tp, block) : block;
}

at::Tensor LocalOfFull(const ParamLayout& layout, const at::Tensor& full) {
  const fsdp::ShardInfo& s = layout.shard;
  at::Tensor block = layout.tp ? tp::local_from_full(*layout.tp, full) : full;
  return block.reshape({s.rows, RowNumel(s.global_shape)})
      .narrow(0, s.row_start, s.local_rows)
      .reshape(s.shard.sizes());
}

bool RowsReadInPlace(const ParamLayout& layout) {
  const fsdp::ShardInfo& s = layout.shard;
  return !layout.tp && !layout.full_shape.empty() && s.shard.device().is_cpu() &&
         s.shard.is_contiguous() && s.shard.numel() == s.local_rows * RowNumel(layout.full_shape);
}

}  // namespace internal
}  // namespace checkpoint
}  // namespace fsdp2
