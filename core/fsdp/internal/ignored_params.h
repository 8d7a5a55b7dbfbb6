// fsdp2/core/fsdp/internal/ignored_params.h
//
// IgnoredParams: the ignored parameters (FSDPOptions::ignored_params) in
// one unit's part of the module tree, and their cast under a mixed-precision
// policy. FSDP leaves them alone -- not sharded, gathered or reduced -- but
// a block computes in param_dtype, so a float32 bias ignored inside a bf16
// block would meet bf16 activations and weights. Each one the policy would
// cast (floating point, of another dtype than param_dtype) is therefore
// cast with the unit's parameters: for the unit's forward, and held until
// the end of its backward, the parameter's data is a param_dtype copy of
// its value; afterwards it is its own value again, in its own dtype, with
// its .grad in that dtype too. The parameter stays the same tensor (the
// optimizer's, the caller's), its master value and optimizer state stay in
// its own dtype: as the unit's sharded parameters, only the compute copy
// is param_dtype.
//
// Internal to core/fsdp. Not thread-safe: the training thread owns it.
#ifndef FSDP2_CORE_FSDP_INTERNAL_IGNORED_PARAMS_H_
#define FSDP2_CORE_FSDP_INTERNAL_IGNORED_PARAMS_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <vector>

namespace fsdp2 {
namespace fsdp {

class IgnoredParams {
 public:
  IgnoredParams() = default;
  // `params`: the ignored parameters in the unit's part of the tree, each
  // once. Those that `param_dtype` (the policy's; none: no cast) would cast
  // are cast; the others are only listed.
  IgnoredParams(std::vector<at::Tensor> params, c10::optional<at::ScalarType> param_dtype);

  const std::vector<at::Tensor>& params() const { return params_; }

  // Points each cast parameter's data at a param_dtype copy of its value,
  // keeping the value aside. Nothing while already cast (a recomputation
  // inside backward, a second call in one forward).
  void cast();
  // Each cast parameter's own value again, and its .grad (from a backward
  // through the copy) in its own dtype. Nothing when not cast.
  void restore();

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> cast_;  // the parameters the policy casts
  std::vector<at::Tensor> own_;   // their own values while cast
  c10::optional<at::ScalarType> dtype_;
  bool is_cast_ = false;
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_IGNORED_PARAMS_H_
