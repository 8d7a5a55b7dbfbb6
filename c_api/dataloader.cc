// fsdp2/c_api/dataloader.cc
//
// fsdp2_dataloader_t: a memory-mapped token file cut into this rank's
// batches (core/strategy/token_dataset.h). The steps that read it are in
// strategy_steps.cc.
#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"
#include "c_api/internal/handles.h"
#include "c_api/internal/options.h"
#include "core/common/error.h"
#include "core/strategy/token_dataset.h"

using namespace fsdp2::c_api;  // NOLINT: the entry points below are C

extern "C" {

fsdp2_status_t fsdp2_dataloader_create_from_token_file(
    fsdp2_strategy_t* strategy, const char* path, const fsdp2_token_loader_options_t* options,
    fsdp2_dataloader_t** out) {
  FSDP2_API_BEGIN
  auto s = GetStrategy(strategy);
  NotNull(path, "path");
  NotNull(out, "out");
  const auto [dataset, global_batch_size] = ToTokenDatasetOptions(options);
  if (!s->strategy->world()) {
    throw fsdp2::FailedPreconditionError(
        "fsdp2_dataloader_create_from_token_file: call fsdp2_strategy_setup_environment first");
  }
  auto state = std::make_shared<LoaderState>();
  state->loader = std::make_unique<fsdp2::strategy::TokenLoader>(
      fsdp2::strategy::MakeTokenLoader(*s->strategy, path, dataset, global_batch_size));
  *out = NewHandle<fsdp2_dataloader_t>(Kind::kLoader, state);
  FSDP2_API_END_FILE
}

void fsdp2_dataloader_destroy(fsdp2_dataloader_t* loader) {
  if (loader != nullptr) RemoveHandle(IdOf(loader), Kind::kLoader);
}

fsdp2_status_t fsdp2_dataloader_num_batches(const fsdp2_dataloader_t* loader, int64_t* count) {
  FSDP2_API_BEGIN
  auto l = GetLoader(loader);
  NotNull(count, "count");
  *count = l->loader->num_batches();
  FSDP2_API_END
}

fsdp2_status_t fsdp2_dataloader_set_epoch(fsdp2_dataloader_t* loader, int64_t epoch) {
  FSDP2_API_BEGIN
  Require(epoch >= 0, "epoch must be non-negative");
  GetLoader(loader)->loader->set_epoch(epoch);
  FSDP2_API_END
}

}  // extern "C"
