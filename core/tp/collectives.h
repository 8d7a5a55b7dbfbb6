// fsdp2/core/tp/collectives.h
//
// The four collectives tensor parallelism puts into a model's forward pass,
// each a custom autograd function whose backward is the matching collective
// (after Megatron-LM's f/g operators):
//
//   copy_to_tensor_parallel      forward: identity    backward: all-reduce
//   reduce_from_tensor_parallel  forward: all-reduce  backward: identity
//   gather_from_tensor_parallel  forward: all-gather  backward: keep own slice
//   scatter_to_tensor_parallel   forward: keep slice  backward: all-gather
//
// Contract: collective over `group`; every rank of it calls the same
// functions in the same order in forward and in backward (the backward
// collectives run on the autograd thread, on the group's default lane, and
// wait for completion). `group` must outlive the autograd graph built from
// the result (the tensor-parallel layers own theirs). A null group or a group
// of one rank makes every function an identity. Reductions are sums; bf16
// reductions run in fp32 inside core/comm. Slices along `dim` are equal:
// the size along `dim` must be a multiple of the group size.
#ifndef FSDP2_CORE_TP_COLLECTIVES_H_
#define FSDP2_CORE_TP_COLLECTIVES_H_

#include <ATen/core/Tensor.h>

#include <memory>

#include "core/comm/process_group.h"

namespace fsdp2 {
namespace tp {

at::Tensor copy_to_tensor_parallel(
    const at::Tensor& x, const std::shared_ptr<comm::ProcessGroup>& group);

at::Tensor reduce_from_tensor_parallel(
    const at::Tensor& x, const std::shared_ptr<comm::ProcessGroup>& group);

// Concatenates every rank's `x` along `dim` (negative counts from the end)
// in rank order.
at::Tensor gather_from_tensor_parallel(
    const at::Tensor& x, const std::shared_ptr<comm::ProcessGroup>& group,
    int64_t dim);

// This rank's slice of `x` along `dim`: chunk rank() of size() equal chunks.
// Throws std::invalid_argument when the size along `dim` does not divide.
at::Tensor scatter_to_tensor_parallel(
    const at::Tensor& x, const std::shared_ptr<comm::ProcessGroup>& group,
    int64_t dim);

// Plain (non-autograd) all-gather along `dim`, for state dicts and tests.
at::Tensor all_gather_along(const at::Tensor& x, comm::ProcessGroup& group,
                            int64_t dim);

}  // namespace tp
}  // namespace fsdp2

#endif  // FSDP2_CORE_TP_COLLECTIVES_H_
