// fsdp2/core/fsdp/activation_checkpoint.h
//
// Activation checkpointing: recompute a module's activations in backward
// instead of keeping them from forward (PyTorch's checkpoint_wrapper with
// use_reentrant=False, torchtitan's "full" and "selective" modes; LibTorch's
// C++ API has no torch.utils.checkpoint).
//
//   fsdp::checkpoint_module(model->block(i));  // or a policy over the units:
//   fsdp::apply_activation_checkpointing(*model, ActivationCheckpointing::Full());
//   auto y = fsdp::forward(model->block(i), x);  // as before
//
// A checkpointed module, called through fsdp::forward() with gradients
// enabled, runs its forward without recording it for autograd: only its
// tensor inputs (and the random generators' states) are kept. When the
// gradient reaches its outputs, backward restores those generator states,
// runs the forward again with gradients enabled on the saved inputs, and
// backpropagates through that recomputation into the inputs and the
// module's parameters; afterwards the generators continue where they were,
// so dropout draws the same masks twice and nothing after it changes. Losses
// and gradients equal those of the module run without checkpointing.
//
// With FSDP (fully_shard.h) the recomputation needs the unit's parameters
// unsharded in backward. It runs inside the unit's backward, after the
// unit's pre-backward has all-gathered them (and prefetched the unit whose
// backward comes next), and its parameter gradients flow into the same
// autograd node as without checkpointing, so the unit's reduce-scatter fires
// as before: no extra all-gather, no extra reduction.
//
// What is checkpointed: a module whose forward takes at::Tensor arguments
// (gradients flow into them) and copyable non-tensor values, and returns
// what fsdp::forward supports. It may be called several times in one
// forward (each call is recomputed on its own) and may contain checkpointed
// plain modules (they are recomputed once more inside its recomputation).
// It may not contain another sharded module: that module would be
// all-gathered again for the recomputation (checkpoint the inner modules
// instead); its forward throws FailedPreconditionError naming both
// modules. Backward through a checkpointed module must not use
// create_graph (no double backward). Without gradients (evaluation,
// NoGradGuard) a checkpointed module just runs.
//
// Thread-safety: as fully_shard.h (one training thread per process). The
// marks are kept in a process-wide registry (thread-safe), weakly: a dead
// module's mark never applies to a module built at its address.
#ifndef FSDP2_CORE_FSDP_ACTIVATION_CHECKPOINT_H_
#define FSDP2_CORE_FSDP_ACTIVATION_CHECKPOINT_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp2 {
namespace fsdp {

class FSDPUnit;

// Which sharded modules apply_activation_checkpointing() checkpoints.
struct ActivationCheckpointing {
  // How many of the candidate units are checkpointed.
  enum class Mode {
    kNone,       // none
    kFull,       // every candidate unit
    kSelective,  // every `every`-th candidate unit: the every-th, 2*every-th...
  };
  Mode mode = Mode::kNone;  // default: no checkpointing
  int every = 2;  // kSelective only; 1 is the same as kFull

  // No checkpointing (the default-constructed policy).
  static ActivationCheckpointing None() { return {}; }
  // Every candidate unit recomputes its activations in backward.
  static ActivationCheckpointing Full() { return {Mode::kFull, 1}; }
  // Every `every`-th candidate unit. Not checked here: an `every` below 1
  // throws InvalidArgumentError from apply_activation_checkpointing().
  static ActivationCheckpointing Selective(int every) {
    return {Mode::kSelective, every};
  }
  // "none", "full" or "selective" (any case), with `every` for selective.
  // Throws InvalidArgumentError naming the accepted values, or when every
  // is below 1.
  static ActivationCheckpointing Parse(const std::string& mode, int every = 2);
  // Whether the policy checkpoints anything (mode is not kNone).
  bool enabled() const { return mode != Mode::kNone; }
  std::string ToString() const;  // "none", "full", "selective(every 2)"
};

// Marks (enabled = false: unmarks) `module` for activation checkpointing, as
// the file comment says. Works for sharded and plain modules. Throws
// InvalidArgumentError for a null module.
void checkpoint_module(const std::shared_ptr<torch::nn::Module>& module,
                       bool enabled = true);
// The same for a module holder (e.g. torch::nn::Linear, or a model's
// TORCH_MODULE type); marks the module it holds.
template <typename Impl>
void checkpoint_module(const torch::nn::ModuleHolder<Impl>& module,
                       bool enabled = true) {
  checkpoint_module(std::static_pointer_cast<torch::nn::Module>(module.ptr()),
                    enabled);
}
// Whether `module` is marked for activation checkpointing (by
// checkpoint_module or apply_activation_checkpointing). Thread-safe.
bool is_checkpointed(const torch::nn::Module& module);

// Applies `policy` to the sharded modules under `root` (fully_shard first):
// the candidates are the units that contain no other unit, in module order
// (the transformer blocks; a model sharded as one unit, such as a
// TorchScript model, is its own only candidate). Units that contain other
// units are never checkpointed (their recomputation would gather the inner
// units again). Marks set earlier stay. Returns the names of the modules
// it checkpointed, as root.named_modules() names them ("" for the root).
// Throws InvalidArgumentError when a policy other than none finds no
// sharded module under `root`.
std::vector<std::string> apply_activation_checkpointing(
    torch::nn::Module& root, const ActivationCheckpointing& policy);

namespace internal {

// Whether fsdp::forward should checkpoint `module` now: it is marked and
// gradients are enabled. Fast when nothing is marked.
bool UseCheckpoint(const torch::nn::Module* module);

// Runs `run(inputs)` (the module's forward on these tensor inputs, returning
// its flattened output tensors) as a checkpointed region: see the file
// comment. `unit` is the module's FSDP unit or null. Called by
// fsdp::forward through CheckpointedForward (forward_detail.h).
using RunFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
std::vector<at::Tensor> CheckpointForward(FSDPUnit* unit,
                                          torch::nn::Module* module, RunFn run,
                                          std::vector<at::Tensor> inputs);

// Throws FailedPreconditionError when a sharded module's forward starts
// inside a checkpointed module's forward or recomputation. Called by the
// unit's pre-forward.
void CheckNotInCheckpointedRegion(const torch::nn::Module* sharded);

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_ACTIVATION_CHECKPOINT_H_
