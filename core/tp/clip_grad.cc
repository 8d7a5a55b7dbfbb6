#include "core/tp/clip_grad.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "core/fsdp/fully_shard.h"
#include "core/tp/parallelize.h"

namespace fsdp2 {
namespace tp {

double clip_grad_norm_(torch::nn::Module& root, double max_norm,
                       double norm_type) {
  TORCH_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive");
  const bool inf_norm = std::isinf(norm_type);
  auto combine = [&](double a, double b) { return inf_norm ? std::max(a, b) : a + b; };
  const comm::ReduceOp op = inf_norm ? comm::ReduceOp::kMax : comm::ReduceOp::kSum;

  std::unordered_set<std::string> split;
  std::shared_ptr<comm::ProcessGroup> tp_group;
  for (const auto& p : sharded_parameters(root)) {
    split.insert(p.name);
    if (p.group && p.group->size() > 1) {
      if (tp_group && tp_group != p.group) {
        throw std::invalid_argument(
            "tp::clip_grad_norm_: the model's tensor-parallel layers use "
            "different groups; clip each group's parameters separately");
      }
      tp_group = p.group;
    }
  }
  // Partial norms per FSDP shard group (null: this rank holds whole
  // tensors), split into tensor-parallel blocks and replicated tensors.
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups;
  std::vector<double> blocks, replicated;
  std::vector<at::Tensor> grads;
  for (const auto& info : fsdp::shard_info(root, /*world_rank=*/0)) {
    const at::Tensor& g = info.shard.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (g.numel() == 0) continue;
    at::Tensor gd = g.detach().to(at::kDouble).abs();
    const double part = inf_norm ? gd.max().item<double>()
                                 : gd.pow(norm_type).sum().item<double>();
    auto it = std::find(groups.begin(), groups.end(), info.group);
    if (it == groups.end()) {
      groups.push_back(info.group);
      blocks.push_back(0);
      replicated.push_back(0);
      it = groups.end() - 1;
    }
    double& acc = split.count(info.name) ? blocks[it - groups.begin()]
                                         : replicated[it - groups.begin()];
    acc = combine(acc, part);
  }
  // Every rank sees the same groups in the same order: one all-reduce of
  // the block sums over the tensor-parallel ranks, then one per FSDP group.
  if (tp_group && !blocks.empty()) {
    at::Tensor t = at::tensor(blocks, at::kDouble);
    tp_group->all_reduce(t, op).wait();
    blocks.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  double total = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    double sum = combine(blocks[i], replicated[i]);
    if (groups[i]) {
      at::Tensor t = at::full({1}, sum, at::kDouble);
      groups[i]->all_reduce(t, op).wait();
      sum = t.item<double>();
    }
    total = combine(total, sum);
  }
  const double norm = inf_norm ? total : std::pow(total, 1.0 / norm_type);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    for (auto& g : grads) g.mul_(coef);
  }
  return norm;
}

}  // namespace tp
}  // namespace fsdp2
