// fsdp2/c_api/internal/errors.h
//
// Exception types the C ABI maps to specific status codes (everything else
// is mapped by its standard type in fsdp2.cc).
#ifndef FSDP2_C_API_INTERNAL_ERRORS_H_
#define FSDP2_C_API_INTERNAL_ERRORS_H_

#include <stdexcept>
#include <string>

namespace fsdp2 {
namespace c_api {

// A buffer's dtype, rank or shape is not what the call needs.
struct ShapeError : std::invalid_argument {
  explicit ShapeError(const std::string& what) : std::invalid_argument(what) {}
};

// A handle that is NULL, destroyed, or of another kind.
struct HandleError : std::invalid_argument {
  explicit HandleError(const std::string& what) : std::invalid_argument(what) {}
};

// A file could not be read or written.
struct IoError : std::runtime_error {
  explicit IoError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace c_api
}  // namespace fsdp2

#endif  // FSDP2_C_API_INTERNAL_ERRORS_H_
