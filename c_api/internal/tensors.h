// fsdp2/c_api/internal/tensors.h
//
// Marshalling between fsdp2_tensor_t (the caller's buffer, dtype, shape)
// and at::Tensor. Borrowed tensors view the caller's memory without a copy
// and are valid only during the call; results are copied into buffers the
// caller sized. Bad buffers throw ShapeError / InvalidArgumentError with
// what was given and what was expected.
#ifndef FSDP2_C_API_INTERNAL_TENSORS_H_
#define FSDP2_C_API_INTERNAL_TENSORS_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <vector>

#include "c_api/fsdp2.h"
#include "core/strategy/training_module.h"

namespace fsdp2 {
namespace c_api {

// FSDP2_DTYPE_* <-> at::ScalarType (UINT16 has no tensor type).
at::ScalarType ToScalarType(int32_t dtype);
// "float32", "bfloat16", "float16" or "float64" (as JSON options name a
// floating-point dtype); InvalidArgumentError otherwise.
at::ScalarType FloatTypeOfName(const std::string& name);
int32_t FromScalarType(at::ScalarType type);

// "[2, 3] dtype 1": a buffer's shape and dtype for messages.
std::string Describe(const fsdp2_tensor_t& t);

// The buffer's shape; ShapeError for a bad ndim or a negative size.
std::vector<int64_t> ShapeOf(const fsdp2_tensor_t& t, const std::string& what);

// A tensor over the caller's buffer (no copy; valid during the call).
at::Tensor Borrow(const fsdp2_tensor_t& t, const std::string& what);

// The batch's n tensors, borrowed.
strategy::Batch BorrowBatch(const fsdp2_tensor_t* batch, size_t n);

// Copies `value` into the caller's `out`, whose dtype and shape must match.
void CopyOut(const at::Tensor& value, fsdp2_tensor_t* out, const std::string& what);

// Fills `out`'s dtype, ndim and shape (not its data) for a result of
// `shape` and `dtype`; ShapeError when it has more than FSDP2_MAX_DIMS dims.
void DescribeInto(const std::vector<int64_t>& shape, int32_t dtype, fsdp2_tensor_t* out,
                  const char* what);

}  // namespace c_api
}  // namespace fsdp2

#endif  // FSDP2_C_API_INTERNAL_TENSORS_H_
