// fsdp2/core/checkpoint/internal/host_staging.h
//
// HostStaging: copies of a rank's tensors in host memory for a save whose
// files are written while training goes on (a background save), as
// PyTorch's DCP stages an async save. A CPU tensor that the next step
// changes is cloned; a device (GPU) tensor is copied into pinned host
// memory by an asynchronous copy on the current stream, so the training
// thread does not wait for the device: the writing thread waits (Wait())
// before it reads. Pinned memory comes from PyTorch's CUDA host allocator,
// which rounds each block up to a power of two and keeps it for the next
// save (up to twice the staged bytes stay pinned); where pinning fails, the
// copy goes to ordinary memory and waits. Internal to core/checkpoint.
#ifndef FSDP2_CORE_CHECKPOINT_INTERNAL_HOST_STAGING_H_
#define FSDP2_CORE_CHECKPOINT_INTERNAL_HOST_STAGING_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <memory>
#include <optional>

namespace fsdp2 {
namespace checkpoint {
namespace internal {

class HostStaging {
 public:
  // `t` in host memory that no training step touches. A CPU tensor is
  // cloned when `live` (a shard or optimizer state the next step changes),
  // else returned as it is (a gathered tensor of its own). A device tensor
  // is copied into pinned host memory (contiguous); the copy may still be
  // in flight until Wait().
  at::Tensor Stage(const at::Tensor& t, bool live);
  // On the staging thread, after the last Stage(): marks the end of the
  // copies on the device's stream.
  void Done();
  // On the writing thread: returns once every staged copy is in host
  // memory. Copy the HostStaging to that thread after Done().
  void Wait() const;

 private:
  std::optional<c10::Device> device_;   // of the device tensors staged
  std::shared_ptr<c10::Event> copied_;  // recorded by Done()
};

}  // namespace internal
}  // namespace checkpoint
}  // namespace fsdp2

#endif  // FSDP2_CORE_CHECKPOINT_INTERNAL_HOST_STAGING_H_
