#include "core/fsdp/clip_grad.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_set>
#include <vector>

#include "core/fsdp/state_dict.h"

namespace fsdp2 {
namespace fsdp {
namespace {

// clip_grad_norm_ takes each gradient's norm in pieces of this many
// elements (512 KiB in double).
constexpr int64_t kNormPiece = int64_t{1} << 16;

// clip_grad_norm_ for gradients on a device: the same sums (in double), per
// group and split as there, as device tensors; the coefficient applied
// with one multi-tensor multiply; the norm read back once.
double DeviceClipGradNorm(const std::vector<at::Tensor>& grads,
                          std::vector<std::vector<at::Tensor>>& blocks,
                          std::vector<std::vector<at::Tensor>>& replicated,
                          const std::vector<std::shared_ptr<comm::ProcessGroup>>& groups,
                          const SplitParameters& split, bool any_split, double max_norm,
                          double norm_type) {
  at::NoGradGuard no_grad;
  const bool inf_norm = std::isinf(norm_type);
  const comm::ReduceOp op = inf_norm ? comm::ReduceOp::kMax : comm::ReduceOp::kSum;
  const at::TensorOptions options = grads[0].options().dtype(at::kDouble);
  blocks.resize(groups.size());
  replicated.resize(groups.size());
  // The sum of |g|^p (or the largest |g|) over `list`, a double on the device.
  auto partial = [&](const std::vector<at::Tensor>& list) {
    if (list.empty()) return at::zeros({}, options);
    std::vector<at::Tensor> norms = at::_foreach_norm(list, norm_type, at::kDouble);
    const at::Tensor n = at::stack(norms);
    return inf_norm ? n.max() : n.pow(norm_type).sum();
  };
  auto combine = [&](const at::Tensor& a, const at::Tensor& b) {
    return inf_norm ? at::maximum(a, b) : a + b;
  };
  std::vector<at::Tensor> block_sums;
  for (const auto& list : blocks) block_sums.push_back(partial(list));
  if (any_split && !block_sums.empty()) {
    at::Tensor t = at::stack(block_sums);
    split.group->all_reduce(t, op).wait();
    block_sums = t.unbind();
  }
  at::Tensor total = at::zeros({}, options);
  for (size_t i = 0; i < groups.size(); ++i) {
    at::Tensor sum = combine(block_sums[i], partial(replicated[i])).reshape({1});
    if (groups[i]) groups[i]->all_reduce(sum, op).wait();
    total = combine(total, sum.reshape({}));
  }
  const at::Tensor norm = inf_norm ? total : total.pow(1.0 / norm_type);
  const at::Tensor coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  // By dtype: the multiply takes one coefficient of each.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& g : grads) {
    if (g.numel() > 0) by_dtype[g.scalar_type()].push_back(g);
  }
  for (auto& [dtype, list] : by_dtype) at::_foreach_mul_(list, coef.to(dtype));
  return norm.item<double>();
}

// The sum of |g|^p over `grad` (its largest |g| for the infinity norm), in
// double, a piece at a time: a whole shard's double copies would be the
// step's memory peak (three of the largest shard, 28 MiB per rank on the
// 85M GPT at N = 2). A shard of one piece sums as before.
double HostPart(const at::Tensor& grad, double norm_type) {
  const bool inf_norm = std::isinf(norm_type);
  const at::Tensor flat = grad.detach().reshape({-1});
  double part = 0;
  for (int64_t start = 0; start < flat.numel(); start += kNormPiece) {
    const at::Tensor gd = flat.narrow(0, start, std::min(kNormPiece, flat.numel() - start))
                              .to(at::kDouble, /*non_blocking=*/false, /*copy=*/true)
                              .abs_();
    const double piece =
        inf_norm ? gd.max().item<double>() : gd.pow_(norm_type).sum().item<double>();
    part = inf_norm ? std::max(part, piece) : part + piece;
  }
  return part;
}

}  // namespace

GradNormParts::GradNormParts(double norm_type) : norm_type_(norm_type) {
  TORCH_CHECK(norm_type > 0, "GradNormParts: norm_type must be positive");
}

void GradNormParts::add(const at::Tensor& grad) {
  if (!grad.defined() || !grad.is_cpu()) return;
  at::NoGradGuard no_grad;
  const double value = grad.numel() == 0 ? 0.0 : HostPart(grad, norm_type_);
  parts_[grad.unsafeGetTensorImpl()] = Part{grad, grad._version(), value};
}

std::optional<double> GradNormParts::find(const at::Tensor& grad) const {
  auto it = parts_.find(grad.unsafeGetTensorImpl());
  if (it == parts_.end() || !it->second.grad.is_same(grad) ||
      it->second.version != grad._version()) {
    return std::nullopt;
  }
  ++used_;
  return it->second.value;
}

void GradNormParts::clear() { parts_.clear(); }

double clip_grad_norm_(torch::nn::Module& root, double max_norm,
                       double norm_type, const SplitParameters& split,
                       const GradNormParts* parts) {
  TORCH_CHECK(parts == nullptr || parts->norm_type() == norm_type,
              "clip_grad_norm_: the parts were taken for another norm_type");
  TORCH_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive");
  const bool inf_norm = std::isinf(norm_type);
  auto combine = [&](double a, double b) { return inf_norm ? std::max(a, b) : a + b; };
  const comm::ReduceOp op = inf_norm ? comm::ReduceOp::kMax : comm::ReduceOp::kSum;
  const bool any_split = split.group && split.group->size() > 1;

  // Partial norms per shard group (null: this rank holds whole tensors),
  // split blocks apart from the rest. The groups follow from the model's
  // structure, so every rank lists the same ones in the same order.
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups;
  std::vector<double> blocks, replicated;
  std::vector<at::Tensor> grads;
  // Gradients on a device (a GPU), by group: their norms are taken there,
  // a few multi-tensor kernels and no wait for the device but the last.
  std::vector<std::vector<at::Tensor>> device_blocks, device_replicated;
  std::unordered_set<const c10::TensorImpl*> seen;  // tied: counted once
  for (const auto& info : shard_info(root, /*world_rank=*/0)) {
    if (!seen.insert(info.shard.unsafeGetTensorImpl()).second) continue;
    auto it = std::find(groups.begin(), groups.end(), info.group);
    if (it == groups.end()) {
      groups.push_back(info.group);
      blocks.push_back(0);
      replicated.push_back(0);
      it = groups.end() - 1;
    }
    const at::Tensor& g = info.shard.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (!g.is_cpu()) {  // summed on the device below
      auto& lists = any_split && split.names.count(info.name) ? device_blocks : device_replicated;
      lists.resize(groups.size());
      lists[it - groups.begin()].push_back(g.detach());
      continue;
    }
    if (g.numel() == 0) continue;
    std::optional<double> ahead = parts ? parts->find(g) : std::nullopt;
    const double part = ahead ? *ahead : HostPart(g, norm_type);
    const size_t i = it - groups.begin();
    double& acc = any_split && split.names.count(info.name) ? blocks[i]
                                                            : replicated[i];
    acc = combine(acc, part);
  }
  if (!grads.empty() && !grads[0].is_cpu()) {
    return DeviceClipGradNorm(grads, device_blocks, device_replicated, groups, split,
                              any_split, max_norm, norm_type);
  }
  // One all-reduce of the block sums over the split group, then one per
  // shard group.
  if (any_split && !blocks.empty()) {
    at::Tensor t = at::tensor(blocks, at::kDouble);
    split.group->all_reduce(t, op).wait();
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

}  // namespace fsdp
}  // namespace fsdp2
