// fsdp2/core/fsdp/assign_data.h
//
// Replacing a tensor's data in place, whatever the devices: what FSDP does
// to a parameter when it shards it, materialises it from the meta device
// or frees it, and what a trainer does when it moves a model's tensors to
// a GPU. The tensor object stays the one that modules, optimizers and
// autograd hold.
#ifndef FSDP2_CORE_FSDP_ASSIGN_DATA_H_
#define FSDP2_CORE_FSDP_ASSIGN_DATA_H_

#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>

namespace fsdp2 {
namespace fsdp {

// t.set_data(data), also where set_data refuses the pair of tensor types
// (from a meta tensor to a real one, or the reverse): `t` keeps its
// identity, autograd metadata and version counter and takes `data`'s
// storage, shape, dtype and device. Call it without autograd recording
// (under NoGradGuard) on a leaf tensor.
inline void assign_data(const at::Tensor& t, const at::Tensor& data) {
  if (at::_has_compatible_shallow_copy_type(t, data)) {
    t.set_data(data);  // as Module::to (CPU <-> CUDA)
  } else {
    t.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
  }
}

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_ASSIGN_DATA_H_
