// fsdp2/c_api/library.cc
//
// The library's own entry points: errors, versions, memory, dtypes.
#include <torch/version.h>

#include <cstdlib>
#include <string>

#include "c_api/fsdp2.h"
#include "c_api/internal/api_impl.h"

extern "C" {

const char* fsdp2_last_error(void) { return fsdp2::c_api::LastError(); }

const char* fsdp2_status_name(int32_t status) {
  switch (status) {
    case FSDP2_OK: return "FSDP2_OK";
    case FSDP2_ERROR_INVALID_ARGUMENT: return "FSDP2_ERROR_INVALID_ARGUMENT";
    case FSDP2_ERROR_INVALID_HANDLE: return "FSDP2_ERROR_INVALID_HANDLE";
    case FSDP2_ERROR_WRONG_ORDER: return "FSDP2_ERROR_WRONG_ORDER";
    case FSDP2_ERROR_SHAPE: return "FSDP2_ERROR_SHAPE";
    case FSDP2_ERROR_IO: return "FSDP2_ERROR_IO";
    case FSDP2_ERROR_RUNTIME: return "FSDP2_ERROR_RUNTIME";
    case FSDP2_ERROR_OUT_OF_MEMORY: return "FSDP2_ERROR_OUT_OF_MEMORY";
    case FSDP2_ERROR_INTERNAL: return "FSDP2_ERROR_INTERNAL";
  }
  return "FSDP2_ERROR_UNKNOWN";
}

int32_t fsdp2_abi_version(void) { return FSDP2_ABI_VERSION; }

const char* fsdp2_version_string(void) {
  static const std::string version =
      std::string("fsdp2 " FSDP2_VERSION " (LibTorch ") +
      std::to_string(TORCH_VERSION_MAJOR) + "." +
      std::to_string(TORCH_VERSION_MINOR) + "." +
      std::to_string(TORCH_VERSION_PATCH) + ", " +
#ifdef FSDP2_WITH_CUDA
      "cuda"
#else
      "cpu"
#endif
      + ")";
  return version.c_str();
}

void fsdp2_free(void* pointer) { std::free(pointer); }

size_t fsdp2_dtype_size(int32_t dtype) {
  switch (dtype) {
    case FSDP2_DTYPE_FLOAT64:
    case FSDP2_DTYPE_INT64: return 8;
    case FSDP2_DTYPE_FLOAT32:
    case FSDP2_DTYPE_INT32: return 4;
    case FSDP2_DTYPE_BFLOAT16:
    case FSDP2_DTYPE_FLOAT16:
    case FSDP2_DTYPE_UINT16: return 2;
    case FSDP2_DTYPE_UINT8: return 1;
  }
  return 0;
}

}  // extern "C"
