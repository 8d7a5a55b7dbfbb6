#include "c_api/internal/tensors.h"

#include <ATen/ATen.h>

#include <sstream>

#include "c_api/internal/api_impl.h"
#include "core/common/error.h"
#include "core/models/hf_config.h"

namespace fsdp2 {
namespace c_api {

at::ScalarType FloatTypeOfName(const std::string& name) {
  return models::FloatDtypeOfName(name);
}

at::ScalarType ToScalarType(int32_t dtype) {
  switch (dtype) {
    case FSDP2_DTYPE_FLOAT32: return at::kFloat;
    case FSDP2_DTYPE_FLOAT64: return at::kDouble;
    case FSDP2_DTYPE_BFLOAT16: return at::kBFloat16;
    case FSDP2_DTYPE_FLOAT16: return at::kHalf;
    case FSDP2_DTYPE_INT64: return at::kLong;
    case FSDP2_DTYPE_INT32: return at::kInt;
    case FSDP2_DTYPE_UINT8: return at::kByte;
    case FSDP2_DTYPE_UINT16: break;  // LibTorch 1.13 has no uint16 tensors
  }
  throw InvalidArgumentError("dtype " + std::to_string(static_cast<int>(dtype)) +
                             " is not supported for tensors (UINT16 is for token files)");
}

int32_t FromScalarType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return FSDP2_DTYPE_FLOAT32;
    case at::kDouble: return FSDP2_DTYPE_FLOAT64;
    case at::kBFloat16: return FSDP2_DTYPE_BFLOAT16;
    case at::kHalf: return FSDP2_DTYPE_FLOAT16;
    case at::kLong: return FSDP2_DTYPE_INT64;
    case at::kInt: return FSDP2_DTYPE_INT32;
    case at::kByte: return FSDP2_DTYPE_UINT8;
    default: break;
  }
  throw InvalidArgumentError(std::string("no C dtype for ") + c10::toString(t));
}

std::string Describe(const fsdp2_tensor_t& t) {
  std::ostringstream s;
  s << "[";
  for (int32_t d = 0; d < t.ndim && d < FSDP2_MAX_DIMS; ++d) s << (d ? ", " : "") << t.shape[d];
  s << "] dtype " << static_cast<int>(t.dtype);
  return s.str();
}

std::vector<int64_t> ShapeOf(const fsdp2_tensor_t& t, const std::string& what) {
  if (t.ndim < 0 || t.ndim > FSDP2_MAX_DIMS) {
    throw ShapeError(what + ": ndim " + std::to_string(t.ndim) + " is outside 0.." +
                     std::to_string(FSDP2_MAX_DIMS));
  }
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  for (int64_t s : shape) {
    if (s < 0) throw ShapeError(what + ": negative size in shape " + Describe(t));
  }
  return shape;
}

at::Tensor Borrow(const fsdp2_tensor_t& t, const std::string& what) {
  std::vector<int64_t> shape = ShapeOf(t, what);
  const at::ScalarType type = ToScalarType(t.dtype);
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel > 0 && t.data == nullptr) throw InvalidArgumentError(what + ": data is NULL");
  if (numel == 0) return at::empty(shape, at::TensorOptions().dtype(type));
  return at::from_blob(t.data, shape, at::TensorOptions().dtype(type));
}

strategy::Batch BorrowBatch(const fsdp2_tensor_t* batch, size_t n) {
  Require(n == 0 || batch != nullptr, "batch is NULL but num_tensors is " + std::to_string(n));
  Require(n > 0, "the batch has no tensors");
  strategy::Batch out;
  for (size_t i = 0; i < n; ++i) out.push_back(Borrow(batch[i], "batch[" + std::to_string(i) + "]"));
  return out;
}

void CopyOut(const at::Tensor& value, fsdp2_tensor_t* out, const std::string& what) {
  NotNull(out, what.c_str());
  const std::vector<int64_t> shape = ShapeOf(*out, what);
  if (out->dtype != FromScalarType(value.scalar_type()) || !value.sizes().equals(shape)) {
    std::ostringstream s;
    s << what << ": the buffer is " << Describe(*out) << ", the value is " << value.sizes()
      << " dtype " << static_cast<int>(FromScalarType(value.scalar_type())) << " ("
      << c10::toString(value.scalar_type()) << ")";
    throw ShapeError(s.str());
  }
  if (value.numel() == 0) return;
  NotNull(out->data, (what + " data").c_str());
  at::from_blob(out->data, shape, value.options().dtype(value.scalar_type())).copy_(value);
}

void DescribeInto(const std::vector<int64_t>& shape, int32_t dtype, fsdp2_tensor_t* out,
                  const char* what) {
  if (shape.size() > FSDP2_MAX_DIMS) {
    throw ShapeError(std::string(what) + " has too many dimensions");
  }
  out->dtype = dtype;
  out->ndim = static_cast<int32_t>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) out->shape[d] = shape[d];
}

}  // namespace c_api
}  // namespace fsdp2
