// fsdp2/c_api/internal/handles.h
//
// What the C handles stand for, and the registry that hands them out.
// Handles are ids in the registry, not pointers: a destroyed handle is
// simply absent, so using it is an InvalidHandleError, never a
// use-after-free. Every Get* returns a shared_ptr that keeps the object
// alive for the call even if another thread destroys the handle meanwhile.
#ifndef FSDP2_C_API_INTERNAL_HANDLES_H_
#define FSDP2_C_API_INTERNAL_HANDLES_H_

#include <cstdint>
#include <memory>

#include "c_api/fsdp2.h"
#include "core/fsdp/fully_shard.h"
#include "core/models/model_family.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/strategy/token_dataset.h"

// The handle types are incomplete in the header; here each is an id.
struct fsdp2_strategy {};
struct fsdp2_model {};
struct fsdp2_dataloader {};
struct fsdp2_unshard_handle {};

namespace fsdp2 {
namespace c_api {

// fsdp2_strategy_t: the strategy and the model connected to it.
struct StrategyState {
  std::unique_ptr<strategy::FSDP2Strategy> strategy;
  std::shared_ptr<models::ModelFamily> module;  // set by fsdp2_strategy_connect
};

// fsdp2_model_t: a model family (core/models' built-in families or a
// TorchScript file), shared with the strategy it is connected to.
struct ModelState {
  std::shared_ptr<models::ModelFamily> module;
};

// fsdp2_dataloader_t: a token file's windows, cut into this rank's batches.
struct LoaderState {
  std::unique_ptr<strategy::TokenLoader> loader;
};

// fsdp2_unshard_handle_t: an all-gather fsdp2_strategy_unshard started. The
// handle holds its unit weakly: it outlives the strategy and the model
// harmlessly.
struct UnshardState {
  fsdp::UnshardHandle handle;
};

enum class Kind { kStrategy, kModel, kLoader, kUnshard };

// Adds `object` under a new id that is never reused.
uintptr_t AddHandle(Kind kind, std::shared_ptr<void> object);
// The live object of `kind` behind `id`; throws InvalidHandleError otherwise.
std::shared_ptr<void> FindHandle(uintptr_t id, Kind kind);
// Removes and returns the object (null if absent or of another kind).
std::shared_ptr<void> RemoveHandle(uintptr_t id, Kind kind);

template <typename Handle>
uintptr_t IdOf(const Handle* handle) {
  return reinterpret_cast<uintptr_t>(handle);
}

template <typename Handle>
Handle* NewHandle(Kind kind, std::shared_ptr<void> object) {
  return reinterpret_cast<Handle*>(AddHandle(kind, std::move(object)));
}

// Throws FailedPreconditionError("<what>: call fsdp2_strategy_connect and
// fsdp2_strategy_parallelize first") unless the strategy is parallelized.
void RequireParallelized(const StrategyState& s, const char* what);

inline std::shared_ptr<StrategyState> GetStrategy(const fsdp2_strategy_t* h) {
  return std::static_pointer_cast<StrategyState>(FindHandle(IdOf(h), Kind::kStrategy));
}
inline std::shared_ptr<ModelState> GetModel(const fsdp2_model_t* h) {
  return std::static_pointer_cast<ModelState>(FindHandle(IdOf(h), Kind::kModel));
}
inline std::shared_ptr<LoaderState> GetLoader(const fsdp2_dataloader_t* h) {
  return std::static_pointer_cast<LoaderState>(FindHandle(IdOf(h), Kind::kLoader));
}
inline std::shared_ptr<UnshardState> GetUnshard(const fsdp2_unshard_handle_t* h) {
  return std::static_pointer_cast<UnshardState>(FindHandle(IdOf(h), Kind::kUnshard));
}

}  // namespace c_api
}  // namespace fsdp2

#endif  // FSDP2_C_API_INTERNAL_HANDLES_H_
