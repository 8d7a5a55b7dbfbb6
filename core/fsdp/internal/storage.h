// fsdp2/core/fsdp/internal/storage.h
//
// Freeing and re-allocating a tensor's storage in place (replacing a
// tensor's data: core/fsdp/assign_data.h). Every view of the tensor
// (including those autograd saved for backward) shares the storage object,
// so after ReallocStorage they all see the new memory, and after
// FreeStorage the memory is really returned: this is how FSDP frees
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

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_STORAGE_H_
