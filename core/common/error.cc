#include "core/common/error.h"

namespace fsdp2 {

const char* ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case ErrorCode::kShape: return "SHAPE";
    case ErrorCode::kInvalidHandle: return "INVALID_HANDLE";
    case ErrorCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case ErrorCode::kNotFound: return "NOT_FOUND";
    case ErrorCode::kIo: return "IO";
    case ErrorCode::kCommunication: return "COMMUNICATION";
    case ErrorCode::kTimeout: return "TIMEOUT";
    case ErrorCode::kOutOfMemory: return "OUT_OF_MEMORY";
    case ErrorCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

void ThrowError(ErrorCode code, const std::string& message) {
  switch (code) {
    case ErrorCode::kInvalidArgument: throw InvalidArgumentError(message);
    case ErrorCode::kShape: throw ShapeError(message);
    case ErrorCode::kInvalidHandle: throw InvalidHandleError(message);
    case ErrorCode::kFailedPrecondition: throw FailedPreconditionError(message);
    case ErrorCode::kNotFound: throw NotFoundError(message);
    case ErrorCode::kIo: throw IoError(message);
    case ErrorCode::kCommunication: throw CommunicationError(message);
    case ErrorCode::kTimeout: throw TimeoutError(message);
    case ErrorCode::kOutOfMemory: throw OutOfMemoryError(message);
    case ErrorCode::kInternal: break;
  }
  throw InternalError(message);
}

const Error* AsError(const std::exception& e) noexcept {
  return dynamic_cast<const Error*>(&e);
}

}  // namespace fsdp2
