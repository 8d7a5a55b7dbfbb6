// fsdp2/core/fsdp/clip_grad.h
//
// Gradient clipping for a sharded model (torch::nn::utils::clip_grad_norm_
// over the unsharded model): the global norm counts every element of every
// parameter once, the shards summed over their shard groups. Tensor
// parallelism names its split parameters here (core/tp/clip_grad.h).
// fully_shard.h includes this header.
//
// Thread-safety: as fully_shard.h (one training thread per process).
#ifndef FSDP2_CORE_FSDP_CLIP_GRAD_H_
#define FSDP2_CORE_FSDP_CLIP_GRAD_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/comm/process_group.h"

namespace fsdp2 {
namespace fsdp {

// Parameters whose local tensor is one block of a tensor split over `group`
// (tensor parallelism, see core/tp): clip_grad_norm_ sums their norms over
// `group`. Every other parameter is the same on each rank of `group` and
// counts once.
struct SplitParameters {
  std::shared_ptr<comm::ProcessGroup> group;  // null or size 1: none split
  std::unordered_set<std::string> names;  // as root.named_parameters() names them
};

class GradNormParts;

// Clips the gradients of every parameter under `root` (the local shards'
// .grad) so that their global norm is at most `max_norm`, like
// torch::nn::utils::clip_grad_norm_ on the unsharded model: every element
// of every parameter counts once (tied parameters too), shards summed over
// their shard groups, `split` blocks over split.group, parameters outside
// FSDP as this rank holds them. norm_type may be infinity. Returns the
// global norm before clipping. Collective over the shard groups and
// split.group. `parts`: gradients' shares of the norm taken ahead
// (GradNormParts, below), used in place of taking them again; or null.
double clip_grad_norm_(torch::nn::Module& root, double max_norm,
                       double norm_type = 2.0,
                       const SplitParameters& split = {},
                       const GradNormParts* parts = nullptr);

// Gradients' shares of a clipping norm taken ahead of clip_grad_norm_,
// which then uses them in place of taking them again (`parts` above).
// CPU offload takes each unit's as its gradients land in host memory, on
// the host optimizer's thread, while the backward of the units before it
// goes on. A part is the sum of |g|^p over a gradient's elements in
// double (for the infinity norm its largest |g|), taken as clip_grad_norm_
// takes it, so a norm from parts is the same to the bit. It serves only
// the same gradient tensor unchanged since (its version counter): one
// accumulated into later is taken again. Only gradients in host memory
// are taken (a device's are summed on the device anyway). Not
// thread-safe: one thread at a time (the one that fills it, then the one
// that clips).
class GradNormParts {
 public:
  // Parts of the norm of type `norm_type` (positive; infinity allowed).
  explicit GradNormParts(double norm_type = 2.0);
  // The norm whose parts these are.
  double norm_type() const { return norm_type_; }
  // Takes `grad`'s part now; a gradient not in host memory (or undefined)
  // is left to clip_grad_norm_. The part keeps `grad` alive until clear().
  void add(const at::Tensor& grad);
  // `grad`'s part, if taken and `grad` unchanged since; counts a use.
  std::optional<double> find(const at::Tensor& grad) const;
  // Forgets every part and the gradients they keep.
  void clear();
  // Parts taken since the last clear().
  size_t size() const { return parts_.size(); }
  // Parts find() gave since construction (what clipping took from here).
  int64_t used() const { return used_; }

 private:
  struct Part {
    at::Tensor grad;  // kept, so that no other tensor reuses its address
    int64_t version;
    double value;
  };
  double norm_type_;
  std::unordered_map<const c10::TensorImpl*, Part> parts_;
  mutable int64_t used_ = 0;
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_CLIP_GRAD_H_
