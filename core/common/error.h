// fsdp2/core/common/error.h
//
// fsdp2::Error: the one error type of the C++ core. Every error fsdp2
// throws carries an ErrorCode saying what kind of failure it is (a bad
// argument, a call in the wrong order, a file, a collective, a bug), the
// way ONNX Runtime's OnnxRuntimeException carries an ErrorCode. The C ABI
// turns the code into an fsdp2_status_t in one place
// (c_api/internal/api_impl.cc); C++ callers read it with
//
//   try { strategy.parallelize(); }
//   catch (const fsdp2::Error& e) { if (e.code() == ErrorCode::kFailedPrecondition) ... }
//
// Each code is thrown as a class that is also the standard exception of its
// category (InvalidArgumentError is a std::invalid_argument,
// FailedPreconditionError a std::logic_error, IoError a
// std::runtime_error, ...), so `catch (const std::invalid_argument&)` and
// `catch (const std::exception&)` keep working. Only the code decides the C
// status, never the standard type.
#ifndef FSDP2_CORE_COMMON_ERROR_H_
#define FSDP2_CORE_COMMON_ERROR_H_

#include <exception>
#include <stdexcept>
#include <string>

namespace fsdp2 {

// The kind of failure an Error reports; the C ABI maps each to an
// fsdp2_status_t (kNotFound and kIo to IO, kCommunication and kTimeout to
// RUNTIME, kFailedPrecondition to WRONG_ORDER, the rest by name).
enum class ErrorCode {
  kInvalidArgument,     // a bad value from the caller; the message says what to change
  kShape,               // a tensor's dtype, rank or shape is not what the call needs
  kInvalidHandle,       // a C ABI handle that is NULL, destroyed or of another kind
  kFailedPrecondition,  // a call in the wrong order (e.g. a step before parallelize())
  kNotFound,            // a file that does not exist
  kIo,                  // a file that cannot be read or written, or is not what it should be
  kCommunication,       // a collective or rendezvous failed (a peer died, a transport error)
  kTimeout,             // a collective or rendezvous ran past its timeout
  kOutOfMemory,         // an allocation failed
  kInternal,            // a broken invariant inside fsdp2: a bug to report
};

// "INVALID_ARGUMENT", "SHAPE", ... (the enumerator without its k, in capitals).
const char* ErrorCodeName(ErrorCode code);

// What every fsdp2 exception is, besides its standard type.
class Error {
 public:
  virtual ~Error() = default;
  // The kind of failure, fixed when the exception was made.
  ErrorCode code() const noexcept { return code_; }
  // The message (the same text as the standard exception's what()).
  virtual const char* what() const noexcept = 0;

 protected:
  // Only CodedError constructs one, with its kCode.
  explicit Error(ErrorCode code) : code_(code) {}
  // Copies the code (exceptions are copied when thrown and rethrown).
  Error(const Error&) = default;
  // Assigns the code; protected so that an Error is not sliced.
  Error& operator=(const Error&) = default;

 private:
  ErrorCode code_;
};

// An Error with code kCode that is also a `Std` (see the aliases below).
template <ErrorCode kCode, typename Std>
class CodedError final : public Std, public Error {
 public:
  // An error of code kCode whose what() is `message` (as given: no prefix).
  explicit CodedError(const std::string& message) : Std(message), Error(kCode) {}
  const char* what() const noexcept override { return Std::what(); }
};

// A bad value from the caller (kInvalidArgument); a std::invalid_argument.
using InvalidArgumentError = CodedError<ErrorCode::kInvalidArgument, std::invalid_argument>;
// An index or value outside its range: kInvalidArgument, a std::out_of_range.
using OutOfRangeError = CodedError<ErrorCode::kInvalidArgument, std::out_of_range>;
// A tensor of the wrong dtype, rank or shape (kShape); a std::invalid_argument.
using ShapeError = CodedError<ErrorCode::kShape, std::invalid_argument>;
// A NULL, destroyed or foreign C handle (kInvalidHandle); a std::invalid_argument.
using InvalidHandleError = CodedError<ErrorCode::kInvalidHandle, std::invalid_argument>;
// A call in the wrong order (kFailedPrecondition); a std::logic_error.
using FailedPreconditionError = CodedError<ErrorCode::kFailedPrecondition, std::logic_error>;
// A bug in fsdp2 (kInternal); a std::logic_error.
using InternalError = CodedError<ErrorCode::kInternal, std::logic_error>;
// A file that does not exist (kNotFound); a std::runtime_error.
using NotFoundError = CodedError<ErrorCode::kNotFound, std::runtime_error>;
// A file that cannot be read or written, or is malformed (kIo); a
// std::runtime_error.
using IoError = CodedError<ErrorCode::kIo, std::runtime_error>;
// A failed collective or rendezvous (kCommunication); a std::runtime_error.
using CommunicationError = CodedError<ErrorCode::kCommunication, std::runtime_error>;
// A collective or rendezvous past its timeout (kTimeout); a std::runtime_error.
using TimeoutError = CodedError<ErrorCode::kTimeout, std::runtime_error>;
// A failed allocation (kOutOfMemory); a std::runtime_error.
using OutOfMemoryError = CodedError<ErrorCode::kOutOfMemory, std::runtime_error>;

// Throws the class of `code` (one of the aliases above) with `message`:
// for rethrowing an Error with more context and the same code.
[[noreturn]] void ThrowError(ErrorCode code, const std::string& message);

// `e` as an fsdp2::Error (to read its code), or nullptr when it is a plain
// standard exception.
const Error* AsError(const std::exception& e) noexcept;

}  // namespace fsdp2

#endif  // FSDP2_CORE_COMMON_ERROR_H_
