#include "c_api/internal/api_impl.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <filesystem>
#include <new>
#include <stdexcept>

namespace fsdp2 {
namespace c_api {
namespace {

thread_local std::string last_error;

fsdp2_status_t Fail(fsdp2_status_t status, const std::string& message) {
  last_error = message;
  return status;
}

// The number in "... you tried to allocate 123 bytes ..." (0 if none).
double RequestedBytes(const std::string& message) {
  const std::string key = "tried to allocate ";
  const size_t at = message.find(key);
  if (at == std::string::npos) return 0;
  try {
    return std::stod(message.substr(at + key.size()));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

std::string HostOutOfMemoryMessage(const std::string& allocator_message) {
  std::string text = "out of host memory: ";
  const double bytes = RequestedBytes(allocator_message);
  if (bytes > 0) {
    char size[64];
    std::snprintf(size, sizeof(size), "%.3g GB", bytes / 1e9);
    text += std::string("allocating ") + size + " failed. ";
  } else {
    text += "an allocation failed. ";
  }
  // The enforce's location and backtrace say nothing a user can act on.
  std::string detail = allocator_message;
  const size_t from = detail.find("DefaultCPUAllocator");
  if (from != std::string::npos) detail = detail.substr(from);
  while (!detail.empty() && (detail.back() == '\n' || detail.back() == ' ')) detail.pop_back();
  return text +
         "Free memory on this machine, or need less: a smaller model or batch, more ranks "
         "sharding it (FULL_SHARD), activation checkpointing, bf16, or a model built "
         "deferred (fsdp2_model_create_deferred) so no rank holds it whole. (LibTorch: " +
         detail + ")";
}

fsdp2_status_t StatusOf(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return FSDP2_ERROR_INVALID_ARGUMENT;
    case ErrorCode::kShape: return FSDP2_ERROR_SHAPE;
    case ErrorCode::kInvalidHandle: return FSDP2_ERROR_INVALID_HANDLE;
    case ErrorCode::kFailedPrecondition: return FSDP2_ERROR_WRONG_ORDER;
    case ErrorCode::kNotFound:
    case ErrorCode::kIo: return FSDP2_ERROR_IO;
    case ErrorCode::kCommunication:
    case ErrorCode::kTimeout: return FSDP2_ERROR_RUNTIME;
    case ErrorCode::kOutOfMemory: return FSDP2_ERROR_OUT_OF_MEMORY;
    case ErrorCode::kInternal: return FSDP2_ERROR_INTERNAL;
  }
  return FSDP2_ERROR_INTERNAL;
}

fsdp2_status_t StatusOfCurrentException(fsdp2_status_t uncoded_status) {
  try {
    throw;
  } catch (const Error& e) {
    return Fail(StatusOf(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return Fail(FSDP2_ERROR_OUT_OF_MEMORY, "out of memory");
  } catch (const c10::OutOfMemoryError& e) {
    // LibTorch's allocators (CUDA's caching allocator among them) say so
    // with their own class: the caller can act on it as on any other OOM.
    return Fail(FSDP2_ERROR_OUT_OF_MEMORY, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    // LibTorch's CPU allocator reports a failed allocation as a plain
    // c10::Error (an enforce in alloc_cpu.cpp) with one of these messages.
    const std::string message = e.what_without_backtrace();
    if (message.find("DefaultCPUAllocator: not enough memory") != std::string::npos ||
        message.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos) {
      return Fail(FSDP2_ERROR_OUT_OF_MEMORY, HostOutOfMemoryMessage(message));
    }
    return Fail(uncoded_status, message);
  } catch (const std::filesystem::filesystem_error& e) {
    return Fail(FSDP2_ERROR_IO, e.what());
  } catch (const std::invalid_argument& e) {
    return Fail(FSDP2_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const std::logic_error& e) {
    return Fail(FSDP2_ERROR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (const std::exception& e) {
    return Fail(uncoded_status, e.what());
  } catch (...) {
    return Fail(FSDP2_ERROR_INTERNAL, "unknown exception");
  }
}

void SetLastError(const std::string& message) { last_error = message; }
const char* LastError() { return last_error.c_str(); }

void Require(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgumentError(message);
}

}  // namespace c_api
}  // namespace fsdp2
