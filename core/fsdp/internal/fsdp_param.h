// fsdp2/core/fsdp/internal/fsdp_param.h
//
// FSDPParam: one parameter a unit owns, its layout when sharded, and the
// views and copies that move it between its shard and the unit's flat
// buffers (PyTorch: _fsdp_param.py).
//
// Layout. A parameter is split along dim 0 into chunks of
// shard_rows = ceil(rows / world) rows; rank r holds the rows
// [r * shard_rows, (r + 1) * shard_rows) that exist, so trailing ranks may
// hold fewer rows or none. A 0-d parameter counts as one row. In
// communication every chunk is padded with zeros to shard_rows rows, so all
// ranks exchange equal sizes. A unit's parameters follow one another in a
// per-rank flat shard: this parameter's padded chunk starts at flat_offset.
//
// Two buffers repeat that flat shard `world` times:
//  - the unsharded buffer (all-gather output) is parameter-major: this
//    parameter occupies [world * flat_offset, world * (flat_offset +
//    shard_numel)), its ranks' chunks in rank order, i.e. all its padded rows
//    in order; its first `rows` rows are the full parameter.
//  - the reduce-scatter input is rank-major, [world, flat + flags]: row r
//    is what rank r receives, this parameter at columns
//    [flat_offset, flat_offset + shard_numel), the unit's contribution
//    flags after the flat shard (fsdp_collectives.h).
//
// Internal to core/fsdp. Not thread-safe: the training thread owns it.
#ifndef FSDP2_CORE_FSDP_INTERNAL_FSDP_PARAM_H_
#define FSDP2_CORE_FSDP_INTERNAL_FSDP_PARAM_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

namespace fsdp2 {
namespace fsdp {

class FSDPParam {
 public:
  // `tensor` is the module's registered parameter at full size (possibly a
  // deferred meta tensor); `name` is relative to the unit's module, e.g.
  // "attn.qkv.weight".
  FSDPParam(std::string name, at::Tensor tensor);

  // Adds a (module, registered name) that holds this tensor; tied parameters
  // have several. Duplicates are ignored.
  void add_slot(torch::nn::Module* module, const std::string& key);

  // Computes where rank `rank` of `world` keeps its rows and where its chunk
  // sits in the per-rank flat shard. Arithmetic on the parameter's shape
  // only: no tensor is touched.
  void init_layout(int world, int rank, int64_t flat_offset);

  // After init_layout(): the shard becomes a new leaf holding a copy of this
  // rank's rows (requiring grad as the parameter did), registered in every
  // slot in place of the parameter, and the module's own tensor (compute())
  // is emptied to 0 elements of `compute_options` until it is unsharded.
  // With `host_shard` (CPU offload) the shard lives in host memory, pinned
  // when `pin_memory` and the parameter is on a device (pageable where
  // pinning fails); a meta parameter's shard stays meta until materialised
  // (shard_options() says where it goes then).
  void init_shard(const at::TensorOptions& compute_options, bool host_shard = false,
                  bool pin_memory = false);
  // Where the shard's values live: host memory (CPU offload), else the
  // parameter's device; `to` is the device that computes.
  at::TensorOptions shard_options(const at::Device& to) const;
  // Whether the shard is kept in host memory (CPU offload).
  bool host_shard() const { return host_shard_; }

  // ---- views and copies (see the file comment for the layouts)

  // This rank's rows of `full` (a tensor of the parameter's global shape),
  // as a [local_rows, row_numel] view.
  at::Tensor local_rows_of(const at::Tensor& full) const;
  // This rank's padded chunk in an unsharded buffer.
  at::Tensor chunk_of(const at::Tensor& unsharded, int world, int rank) const;
  // Copy-in for the all-gather: the shard (or `source`, a copy of it on the
  // device, with CPU offload) into `chunk`, then zero padding.
  void copy_shard_to(const at::Tensor& chunk, const at::Tensor& source = at::Tensor()) const;
  // The full parameter as a view of an unsharded buffer.
  at::Tensor unsharded_view(const at::Tensor& unsharded, int world) const;
  // Copy-in for the reduce-scatter: a full-size gradient's rows into their
  // columns of `by_rank` ([world, flat]), cast to its dtype. Padding is not
  // written.
  void copy_grad_to(const at::Tensor& grad, const at::Tensor& by_rank) const;
  // This rank's part of a reduce-scatter output ([flat]) shaped as the shard.
  at::Tensor reduced_grad_view(const at::Tensor& reduced) const;

  // The module's tensor: points at the unsharded buffer, at the shard itself
  // (one rank, no dtype change), or at an empty tensor when resharded. Its
  // identity never changes, so module members and saved views stay valid.
  void point_compute_at_unsharded(const at::Tensor& unsharded, int world);
  void point_compute_at_shard();
  void free_compute(const at::TensorOptions& compute_options);

  // Adds `grad` to the shard's .grad, or makes .grad a contiguous copy of it
  // in the shard's dtype: a tensor of its own, never a view of a flat buffer
  // or of a gradient autograd may hand to other nodes (zero_grad() detaches
  // .grad in place, which a view refuses).
  void accumulate_grad(const at::Tensor& grad);

  // ---- accessors
  const std::string& name() const { return name_; }
  const std::vector<std::pair<torch::nn::Module*, std::string>>& slots() const {
    return slots_;
  }
  const at::Tensor& compute() const { return compute_; }
  const at::Tensor& shard() const { return shard_; }  // the optimizer's leaf
  bool requires_grad() const { return requires_grad_; }  // false: frozen
  const std::vector<int64_t>& global_shape() const { return global_shape_; }
  std::vector<int64_t> shard_shape() const;  // [local_rows, global dims 1..]
  int64_t rows() const { return rows_; }  // global dim 0 (1 for 0-d)
  int64_t row_numel() const { return row_numel_; }
  int64_t shard_rows() const { return shard_rows_; }  // padded, per rank
  int64_t local_rows() const { return local_rows_; }  // <= shard_rows
  int64_t row_start() const { return row_start_; }
  int64_t flat_offset() const { return flat_offset_; }
  int64_t shard_numel() const { return shard_rows_ * row_numel_; }
  int64_t local_numel() const { return local_rows_ * row_numel_; }
  int64_t global_numel() const { return rows_ * row_numel_; }
  // Whether `world` padded chunks hold more rows than the parameter.
  bool padded(int world) const { return shard_rows_ * world != rows_; }

 private:
  std::string name_;
  std::vector<std::pair<torch::nn::Module*, std::string>> slots_;
  at::Tensor compute_;
  at::Tensor shard_;
  bool requires_grad_ = true;
  bool host_shard_ = false;  // CPU offload: the shard lives in host memory
  bool pin_memory_ = false;  // ... pinned where the parameter is on a device
  std::vector<int64_t> global_shape_;
  int64_t rows_ = 0;
  int64_t row_numel_ = 0;
  int64_t shard_rows_ = 0;
  int64_t local_rows_ = 0;
  int64_t row_start_ = 0;
  int64_t flat_offset_ = 0;
};

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_FSDP_PARAM_H_
