// fsdp2/core/fsdp/mixed_precision.h
//
// MixedPrecisionPolicy: which dtypes FSDP uses for compute and communication.
// The sharded parameters (what the optimizer updates) always keep their own
// dtype and are the master copy; the policy only decides what is gathered,
// computed with and reduced.
#ifndef FSDP2_CORE_FSDP_MIXED_PRECISION_H_
#define FSDP2_CORE_FSDP_MIXED_PRECISION_H_

#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

namespace fsdp2 {
namespace fsdp {

// The dtypes of a unit's gathered parameters, gradient reduction and root
// outputs. Default-constructed: no casting at all (full precision).
struct MixedPrecisionPolicy {
  // dtype of all-gathered (unsharded) parameters and hence of the forward and
  // backward compute. nullopt: the parameters' own dtype.
  c10::optional<at::ScalarType> param_dtype;
  // dtype in which gradients are reduced across ranks. nullopt: param_dtype
  // if set, else the parameters' own dtype.
  c10::optional<at::ScalarType> reduce_dtype;
  // dtype that floating-point outputs of the root unit's forward (what the
  // caller sees) are cast to. Inner units keep param_dtype between them.
  c10::optional<at::ScalarType> output_dtype;
  // Cast floating-point tensor inputs of each unit's forward to param_dtype.
  bool cast_forward_inputs = true;
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_MIXED_PRECISION_H_
