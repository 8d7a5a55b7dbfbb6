// fsdp2/core/script/script_model.h
//
// ScriptModel: a TorchScript module (torch.jit.save from Python, or
// torch::jit::Module::save) trained under FSDP block by block, as a C++
// model is.
//
//   auto model = script::LoadScriptModel("model.pt", {});   // default policy
//   strategy.connect(...);  strategy.parallelize();        // units, then root
//   c10::IValue out = model->forward({tokens, mask});
//
// The script stays the script: its forward runs in the TorchScript
// interpreter with its own code. What changes:
//  - A torch::nn::Module tree mirrors the script's module tree (one mirror
//    per submodule, each registering the submodule's own parameters as the
//    very tensors the script holds), so named_parameters() names them as the
//    script does ("blocks.0.up.weight"), and fully_shard() can shard a
//    mirror: when FSDP swaps a parameter's storage, the script sees it.
//  - The wrapped submodules (the policy below) each become an FSDP unit. At
//    construction every call of their forward in the script's code
//    (prim::CallMethod "forward" on a submodule) is replaced by the
//    operator fsdp2::unit_forward, which runs that submodule's forward
//    between the unit's pre- and post-forward, exactly as fsdp::forward()
//    runs a C++ module: all-gather (with prefetch), reshard after forward,
//    the backward hooks, mixed-precision input casts, and activation
//    checkpointing when the mirror is marked (checkpoint_module). The
//    operator finds the unit by the submodule object itself, so instances
//    of a class that shares compiled code stay apart, and a call of a
//    submodule that is not (yet) sharded just runs.
//
// Wrapping policy (ScriptWrapPolicy::auto_wrap):
//  - unset (the default): every child of every torch.nn.ModuleList in the
//    script, at any depth, that holds parameters (transformer blocks, and
//    experts kept in a ModuleList inside a block), as the reference
//    parallelize_fn does for C++ models;
//  - a list: each entry is a submodule path ("blocks.3", "encoder.layers.0")
//    or a class name matched against the scripted class ("Block" matches
//    __torch__.Block and __torch__.model.Block; "model.Block" only the
//    latter), like Lightning's transformer_auto_wrap_policy. An entry that
//    names neither is an InvalidArgumentError listing the classes and
//    ModuleLists the script has; the empty list keeps the whole script as
//    one unit. The root is always a unit of its own (the strategy shards it
//    last).
// Units are applied bottom-up: a wrapped submodule inside another is
// sharded first.
//
// Forward arguments and results: anything TorchScript passes (tensors,
// tuples, lists, dicts, None, numbers); tensors inside them are cast and
// hooked. Thread-safety: as fully_shard.h (one training thread).
#ifndef FSDP2_CORE_SCRIPT_SCRIPT_MODEL_H_
#define FSDP2_CORE_SCRIPT_SCRIPT_MODEL_H_

#include <ATen/core/ivalue.h>
#include <c10/util/Optional.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "core/fsdp/unit_plan.h"

namespace fsdp2 {
namespace script {

struct ScriptWrapPolicy {
  // See the file comment: unset = every ModuleList child; a list of paths
  // and class names; empty = the whole script as one unit.
  c10::optional<std::vector<std::string>> auto_wrap;
};

class ScriptModelImpl : public torch::nn::Module, public fsdp::UnitPlanProvider {
 public:
  // Mirrors `script`, resolves the policy and rewrites the call boundaries
  // of the wrapped submodules (see the file comment). Call before the
  // script's forward first runs: an already compiled forward keeps its
  // calls. Throws InvalidArgumentError for a policy entry that matches
  // nothing or names the root, or a script without forward.
  ScriptModelImpl(torch::jit::Module script, const ScriptWrapPolicy& policy);
  ~ScriptModelImpl() override;

  // The script's forward on `inputs` (positional), under FSDP once
  // parallelized: the root unit around it, each wrapped submodule's unit
  // around its calls.
  c10::IValue forward(std::vector<c10::IValue> inputs);

  // The forward's parameters after self: how many there are, how many must
  // be given (the rest have defaults), and their names.
  size_t num_inputs() const;
  size_t num_required_inputs() const;
  std::vector<std::string> input_names() const;

  // The wrapped submodules' paths, bottom-up (the order fsdp_unit_plan()
  // returns their mirrors in).
  const std::vector<std::string>& unit_paths() const { return unit_paths_; }
  std::vector<std::shared_ptr<torch::nn::Module>> fsdp_unit_plan() override;

  torch::jit::Module& script() { return script_; }

 private:
  torch::jit::Module script_;
  std::vector<std::string> unit_paths_;
  std::vector<std::shared_ptr<torch::nn::Module>> unit_mirrors_;
  std::vector<const c10::ivalue::Object*> registered_;  // in the call registry
};
TORCH_MODULE(ScriptModel);

// Loads a TorchScript file in training mode and wraps it as above. Throws
// IoError when the file is missing or not a TorchScript archive,
// InvalidArgumentError as the constructor.
ScriptModel LoadScriptModel(const std::string& path, const ScriptWrapPolicy& policy);

}  // namespace script
}  // namespace fsdp2

#endif  // FSDP2_CORE_SCRIPT_SCRIPT_MODEL_H_
