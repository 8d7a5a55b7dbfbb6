// fsdp2/core/script/script_family.h
//
// A TorchScript file as a models::ModelFamily (core/models/model_family.h):
// a ScriptModel (one FSDP unit per wrapped submodule, then the root) with a
// loss, its batches checked against the script's forward before any
// collective runs. What the C ABI's fsdp2_model_load_torchscript* load.
//
//   auto family = script::LoadScriptFamily("model.pt", R"({"loss": "cross_entropy"})");
//   strategy.connect(family);  strategy.parallelize();
//
// Losses: "mse" (default) and "cross_entropy" take every batch tensor but
// the last as the forward's inputs, positionally (floating-point ones cast
// to the script's parameter dtype), and the last as the target; "model"
// gives every tensor to the forward, which returns the loss as a
// floating-point scalar. The prediction is the forward's output tensor for
// the batch's first tensors.
#ifndef FSDP2_CORE_SCRIPT_SCRIPT_FAMILY_H_
#define FSDP2_CORE_SCRIPT_SCRIPT_FAMILY_H_

#include <memory>
#include <string>

#include "core/models/model_family.h"

namespace fsdp2 {
namespace script {

// Loads the TorchScript file `path` with its options, a JSON object:
// "loss" ("mse", "cross_entropy" or "model") and "auto_wrap" (a list of
// submodule paths and class names: ScriptWrapPolicy). Throws
// InvalidArgumentError for bad JSON, an unknown key or loss, a bad
// auto_wrap entry or a script without trainable parameters; the file's
// errors are LoadScriptModel's.
std::shared_ptr<models::ModelFamily> LoadScriptFamily(const std::string& path,
                                                      const std::string& options_json);

}  // namespace script
}  // namespace fsdp2

#endif  // FSDP2_CORE_SCRIPT_SCRIPT_FAMILY_H_
