// fsdp2/core/fsdp/internal/storage.h
//
// Freeing, re-allocating and replacing a tensor's storage in place. Every
// view of the tensor (including those autograd saved for backward) shares the
// storage object, so after ReallocStorage they all see the new memory, and
// after FreeStorage the memory is really returned: this is how FSDP frees
// unsharded parameters between forward and backward without breaking saved
// views. A view must not be read while its storage is freed.
#ifndef FSDP2_CORE_FSDP_INTERNAL_STORAGE_H_
#define FSDP2_CORE_FSDP_INTERNAL_STORAGE_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

namespace fsdp2 {
namespace fsdp {
namespace internal {

inline void FreeStorage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == 0) return;
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
}

inline void ReallocStorage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == nbytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

// t.set_data(data), also from a meta tensor to a real one (which set_data
// refuses): `t` keeps its identity, autograd metadata and version counter.
inline void AssignData(const at::Tensor& t, const at::Tensor& data) {
  if (at::_has_compatible_shallow_copy_type(t, data)) {
    t.set_data(data);
  } else {
    t.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
  }
}

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_STORAGE_H_
