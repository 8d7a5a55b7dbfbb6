// fsdp2/c_api/fsdp2_cpp.h
//
// RAII for C++ callers of the C ABI (after ggml-cpp.h): std::unique_ptr
// aliases that call the matching *_destroy, and Check(), which turns a
// status into an exception carrying fsdp2_last_error(). Header-only; the
// ABI stays C.
#ifndef FSDP2_C_API_FSDP2_CPP_H_
#define FSDP2_C_API_FSDP2_CPP_H_

#include <memory>
#include <stdexcept>
#include <string>

#include "fsdp2.h"  // its sibling, here and where installed (include/fsdp2/)

namespace fsdp2_c {

// The deleter of StrategyPtr: destroys the strategy (which tears it down).
struct StrategyDeleter {
  // Calls fsdp2_strategy_destroy(s); NULL is accepted, nothing thrown.
  void operator()(fsdp2_strategy_t* s) const { fsdp2_strategy_destroy(s); }
};
// The deleter of ModelPtr: releases the caller's model reference.
struct ModelDeleter {
  // Calls fsdp2_model_destroy(m); a strategy the model is connected to
  // keeps its own reference.
  void operator()(fsdp2_model_t* m) const { fsdp2_model_destroy(m); }
};
// The deleter of DataLoaderPtr: destroys the data loader.
struct DataLoaderDeleter {
  // Calls fsdp2_dataloader_destroy(l); NULL is accepted.
  void operator()(fsdp2_dataloader_t* l) const { fsdp2_dataloader_destroy(l); }
};
// The deleter of BufferPtr: frees memory the library allocated.
struct FreeDeleter {
  // Calls fsdp2_free(p), the only right way to free the library's memory.
  void operator()(void* p) const { fsdp2_free(p); }
};

// Owns a strategy from fsdp2_strategy_create: StrategyPtr s(raw).
using StrategyPtr = std::unique_ptr<fsdp2_strategy_t, StrategyDeleter>;
// Owns a model from fsdp2_model_create (or a _load_torchscript function).
using ModelPtr = std::unique_ptr<fsdp2_model_t, ModelDeleter>;
// Owns a loader from fsdp2_dataloader_create_from_token_file.
using DataLoaderPtr = std::unique_ptr<fsdp2_dataloader_t, DataLoaderDeleter>;
// Owns library-allocated memory, such as fsdp2_strategy_optimizer_state_dict's
// *data.
using BufferPtr = std::unique_ptr<void, FreeDeleter>;

// The error a failed call raised: its status and message.
class Error : public std::runtime_error {
 public:
  // what() is "<status name>: <message>", e.g. "FSDP2_ERROR_SHAPE: ...".
  Error(fsdp2_status_t status, const std::string& message)
      : std::runtime_error(std::string(fsdp2_status_name(status)) + ": " + message),
        status_(status) {}
  // The failed call's status (never FSDP2_OK when thrown by Check).
  fsdp2_status_t status() const { return status_; }

 private:
  fsdp2_status_t status_;
};

// Throws Error unless `status` is FSDP2_OK.
inline void Check(fsdp2_status_t status) {
  if (status != FSDP2_OK) throw Error(status, fsdp2_last_error());
}

}  // namespace fsdp2_c

#endif  // FSDP2_C_API_FSDP2_CPP_H_
