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

struct StrategyDeleter {
  void operator()(fsdp2_strategy_t* s) const { fsdp2_strategy_destroy(s); }
};
struct ModelDeleter {
  void operator()(fsdp2_model_t* m) const { fsdp2_model_destroy(m); }
};
struct DataLoaderDeleter {
  void operator()(fsdp2_dataloader_t* l) const { fsdp2_dataloader_destroy(l); }
};
struct FreeDeleter {
  void operator()(void* p) const { fsdp2_free(p); }
};

using StrategyPtr = std::unique_ptr<fsdp2_strategy_t, StrategyDeleter>;
using ModelPtr = std::unique_ptr<fsdp2_model_t, ModelDeleter>;
using DataLoaderPtr = std::unique_ptr<fsdp2_dataloader_t, DataLoaderDeleter>;
using BufferPtr = std::unique_ptr<void, FreeDeleter>;

// The error a failed call raised: its status and message.
class Error : public std::runtime_error {
 public:
  Error(fsdp2_status_t status, const std::string& message)
      : std::runtime_error(std::string(fsdp2_status_name(status)) + ": " + message),
        status_(status) {}
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
