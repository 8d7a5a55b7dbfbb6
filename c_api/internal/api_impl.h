// fsdp2/c_api/internal/api_impl.h
//
// The entry macro pair every C function's body sits in, after ONNX
// Runtime's API_IMPL_BEGIN/END: no C++ exception crosses the boundary. An
// fsdp2::Error becomes the status of its code, a standard exception the
// status of its kind (StatusOfCurrentException), and the message is kept
// as this thread's last error (fsdp2_last_error).
//
//   fsdp2_status_t fsdp2_thing_do(fsdp2_thing_t* thing, int32_t* out) {
//     FSDP2_API_BEGIN
//     NotNull(out, "out");
//     *out = GetThing(thing)->Do();
//     FSDP2_API_END
//   }
#ifndef FSDP2_C_API_INTERNAL_API_IMPL_H_
#define FSDP2_C_API_INTERNAL_API_IMPL_H_

#include <string>

#include "c_api/fsdp2.h"
#include "core/common/error.h"

namespace fsdp2 {
namespace c_api {

// The status of an error code: the one place codes become statuses.
fsdp2_status_t StatusOf(ErrorCode code);

// Classifies the exception in flight (call only from a catch block), sets
// the last error and returns its status. An exception with no fsdp2 code
// maps by its standard type: std::bad_alloc, LibTorch's
// c10::OutOfMemoryError (CUDA's caching allocator) and its CPU allocator's
// "not enough memory" / "can't allocate memory" (HostOutOfMemoryMessage) ->
// OUT_OF_MEMORY,
// std::invalid_argument -> INVALID_ARGUMENT, std::filesystem errors -> IO,
// any other std::logic_error (std::future_error, std::out_of_range, ...) ->
// INTERNAL, any other exception -> `uncoded_status` (RUNTIME, or IO for
// file operations), a non-std exception -> INTERNAL.
fsdp2_status_t StatusOfCurrentException(fsdp2_status_t uncoded_status = FSDP2_ERROR_RUNTIME);

// What fsdp2_last_error says when LibTorch's CPU allocator could not
// allocate: the size that failed, what to do about it, and the allocator's
// own words (`allocator_message`, without the enforce's location).
std::string HostOutOfMemoryMessage(const std::string& allocator_message);

// Sets this thread's last error (fsdp2_last_error).
void SetLastError(const std::string& message);
const char* LastError();

// Throws InvalidArgumentError(message) unless `ok`.
void Require(bool ok, const std::string& message);

// `p`, or InvalidArgumentError("<what> is NULL").
template <typename T>
T* NotNull(T* p, const char* what) {
  if (p == nullptr) throw InvalidArgumentError(std::string(what) + " is NULL");
  return p;
}

}  // namespace c_api
}  // namespace fsdp2

#define FSDP2_API_BEGIN try {
#define FSDP2_API_END                                  \
  return FSDP2_OK;                                     \
  }                                                    \
  catch (...) {                                        \
    return ::fsdp2::c_api::StatusOfCurrentException(); \
  }
// As FSDP2_API_END, for calls that read or write files: a failure that
// carries no fsdp2 code (a LibTorch or system error) is an I/O error.
#define FSDP2_API_END_FILE                                               \
  return FSDP2_OK;                                                       \
  }                                                                      \
  catch (...) {                                                          \
    return ::fsdp2::c_api::StatusOfCurrentException(FSDP2_ERROR_IO);     \
  }

#endif  // FSDP2_C_API_INTERNAL_API_IMPL_H_
