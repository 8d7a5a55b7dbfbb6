// fsdp2/core/fsdp/offload.h
//
// What CPU offload (OffloadPolicy in fsdp_options.h) hands to whoever steps
// the optimizer: one unit's reduced gradients, copied to host memory.
//
// With offload on, a unit's gradient reduction does not write its shards'
// .grad on the device. Its reduced rows are copied device to host on a copy
// stream, and the unit hands one HostGradients to the sink of its root
// (set_host_gradient_sink in fully_shard.h) as soon as the copies are
// queued: the backward of the units before it goes on meanwhile. The sink
// (FSDP2Strategy's host optimizer steps, for one) calls apply() when it is
// ready to use them, on a thread of its own if it likes; apply() waits for
// the copies and adds the gradients to the shards' .grad. Without a sink
// the unit applies them itself before its hook returns, so that .grad is
// complete when backward() returns, as without offload.
#ifndef FSDP2_CORE_FSDP_OFFLOAD_H_
#define FSDP2_CORE_FSDP_OFFLOAD_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace c10 {
struct Event;
}  // namespace c10

namespace fsdp2 {
namespace fsdp {

// One unit's reduced gradients of one backward, in host memory (see the
// file comment). Thread-safe: apply() may run on any thread, once; the
// rest is read-only once the unit has handed it over.
class HostGradients {
 public:
  // An empty batch for the trainable shards `shards` of one unit (every
  // one of them, also those that get no gradient this time), whose
  // gradients are copied from `device`.
  HostGradients(std::vector<at::Tensor> shards, at::Device device);
  ~HostGradients();
  HostGradients(const HostGradients&) = delete;
  HostGradients& operator=(const HostGradients&) = delete;

  // Filling (the engine): `grad` (host memory, its own storage, the shard's
  // shape) is what `shard` receives; on a device it is valid only once
  // copied() has been recorded.
  void add(at::Tensor shard, at::Tensor grad);
  // On a device: the copies queued so far on `stream` finish before
  // apply() reads them (records an event there). Not needed on the CPU.
  void copied(const c10::Stream& stream);

  // Waits for the copies, then adds each gradient to its shard's .grad, or
  // makes it the .grad (in the shard's dtype, a tensor of its own) where
  // there is none. Every call after the first does nothing.
  void apply();

  // Every trainable shard of the unit, in the unit's parameter order.
  const std::vector<at::Tensor>& shards() const { return shards_; }
  // How many shards receive a gradient.
  size_t size() const { return grads_.size(); }
  // The bytes of host memory the gradients hold (until apply()).
  int64_t bytes() const;

 private:
  std::vector<at::Tensor> shards_;
  at::Device device_;
  std::vector<std::pair<at::Tensor, at::Tensor>> grads_;  // (shard, gradient)
  std::unique_ptr<c10::Event> copied_;                     // null on the CPU
  mutable std::mutex mu_;                                  // guards applied_, grads_
  bool applied_ = false;
};

// Receives each unit's HostGradients during backward (see the file
// comment). Called on the thread that runs the unit's gradient hook (the
// autograd engine's, for a GPU); must not block for long.
using HostGradientSink = std::function<void(std::shared_ptr<HostGradients>)>;

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_OFFLOAD_H_
