#include "core/tp/clip_grad.h"
#include "core/common/error.h"

#include <stdexcept>

#include "core/fsdp/fully_shard.h"
#include "core/tp/parallelize.h"

namespace fsdp2 {
namespace tp {

double clip_grad_norm_(torch::nn::Module& root, double max_norm,
                       double norm_type, const fsdp::GradNormParts* parts) {
  fsdp::SplitParameters split;
  for (const auto& p : sharded_parameters(root)) {
    split.names.insert(p.name);
    if (p.group && p.group->size() > 1) {
      if (split.group && split.group != p.group) {
        throw InvalidArgumentError(
            "tp::clip_grad_norm_: the model's tensor-parallel layers use "
            "different groups; clip each group's parameters separately");
      }
      split.group = p.group;
    }
  }
  return fsdp::clip_grad_norm_(root, max_norm, norm_type, split, parts);
}

}  // namespace tp
}  // namespace fsdp2
