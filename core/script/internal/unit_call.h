// fsdp2/core/script/internal/unit_call.h
//
// The call boundary between TorchScript code and FSDP units: the operator
// fsdp2::unit_forward(Any self, Any[] args) -> Any that replaces a
// submodule's forward call in a script's graph, the process-wide registry
// that maps a script submodule object to its torch::nn::Module mirror (and
// so to its FSDP unit), and the call itself, which ScriptModel also uses
// for the root.
//
// Internal to core/script (ScriptModel is the public face).
#ifndef FSDP2_CORE_SCRIPT_INTERNAL_UNIT_CALL_H_
#define FSDP2_CORE_SCRIPT_INTERNAL_UNIT_CALL_H_

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>

#include <memory>
#include <unordered_set>
#include <vector>

namespace fsdp2 {
namespace script {
namespace internal {

// Runs `module.forward(args)`; when `mirror` is sharded (fsdp::unit_of) or
// marked for activation checkpointing, between the unit's pre- and
// post-forward, with the tensors inside `args` cast as the unit's mixed
// precision policy asks and those inside the result hooked for backward,
// as fsdp::forward() does for a C++ module. `mirror` may be null.
c10::IValue CallUnit(torch::nn::Module* mirror, const torch::jit::Module& module,
                     std::vector<c10::IValue> args);

// Registers `mirror` for the script object `object` (held weakly: a dead
// mirror is never called), or forgets it. Thread-safe.
void RegisterMirror(const c10::ivalue::Object* object,
                    const std::shared_ptr<torch::nn::Module>& mirror);
void UnregisterMirror(const c10::ivalue::Object* object);

// Replaces every prim::CallMethod "forward" whose callee's type is in
// `types`, in every method of every class in `script`'s module tree
// (including nested blocks: branches and loops), by fsdp2::unit_forward.
// Returns the number of calls replaced. Idempotent.
int RewriteSubmoduleCalls(const torch::jit::Module& script,
                          const std::unordered_set<const c10::ClassType*>& types);

}  // namespace internal
}  // namespace script
}  // namespace fsdp2

#endif  // FSDP2_CORE_SCRIPT_INTERNAL_UNIT_CALL_H_
