// fsdp2/c_api/unshard.cc
//
// Explicit unshard (with its handle on the all-gather) and reshard of one
// sharded module by name: FSDP2Strategy::unshard / reshard.
#include <string>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "c_api/internal/handles.h"

using namespace fsdp2::c_api;  // NOLINT: the entry points below are C

extern "C" {

fsdp2_status_t fsdp2_strategy_unshard(fsdp2_strategy_t* strategy, const char* module,
                                      int32_t async_op, fsdp2_unshard_handle_t** out) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(module, "module");
  Require(async_op == 0 || async_op == 1,
          "async_op must be 0 (wait) or 1 (return at once), got " + std::to_string(async_op));
  RequireParallelized(*s, "fsdp2_strategy_unshard");
  auto state = std::make_shared<UnshardState>();
  state->handle = s->strategy->unshard(module, async_op == 1);
  if (out != nullptr) *out = NewHandle<fsdp2_unshard_handle_t>(Kind::kUnshard, state);
  FSDP2_API_END
}

fsdp2_status_t fsdp2_unshard_handle_wait(fsdp2_unshard_handle_t* handle) {
  FSDP2_API_BEGIN
  GetUnshard(handle)->handle.wait();
  FSDP2_API_END
}

void fsdp2_unshard_handle_destroy(fsdp2_unshard_handle_t* handle) {
  if (handle != nullptr) RemoveHandle(IdOf(handle), Kind::kUnshard);
}

fsdp2_status_t fsdp2_strategy_reshard(fsdp2_strategy_t* strategy, const char* module) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(module, "module");
  RequireParallelized(*s, "fsdp2_strategy_reshard");
  s->strategy->reshard(module);
  FSDP2_API_END
}

}  // extern "C"
