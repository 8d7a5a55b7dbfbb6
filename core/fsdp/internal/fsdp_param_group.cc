#include "core/fsdp/internal/fsdp_param_group.h"
#include "core/common/error.h"

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/fsdp/internal/buffer_pool.h"
#include "core/fsdp/internal/deferred_log.h"
#include "core/fsdp/internal/host_offload.h"
#include "core/fsdp/internal/storage.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

namespace fsdp2 {
namespace fsdp {
namespace {

std::atomic<int64_t> g_unsharded_bytes{0};
std::atomic<int64_t> g_peak_unsharded_bytes{0};

void AddUnshardedBytes(int64_t delta) {
  int64_t now = g_unsharded_bytes.fetch_add(delta) + delta;
  int64_t peak = g_peak_unsharded_bytes.load();
  while (now > peak && !g_peak_unsharded_bytes.compare_exchange_weak(peak, now)) {
  }
}

// Seconds since `start`, added to `total`.
void AddSecondsSince(std::chrono::steady_clock::time_point start,
                     double& total) {
  total += std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
               .count();
}

// Waits for `done`, adding the time blocked to `total`.
void WaitTimed(const comm::CommHandle& done, double& total) {
  const auto start = std::chrono::steady_clock::now();
  done.wait();
  AddSecondsSince(start, total);
}

struct Groups {
  std::shared_ptr<comm::ProcessGroup> shard;      // null: one shard
  std::shared_ptr<comm::ProcessGroup> replicate;  // null: no replicas
  std::string shard_dim;                          // the mesh dim of `shard`
};

// The groups `options.strategy` shards and replicates over on its mesh.
Groups PickGroups(const FSDPOptions& options) {
  const auto& mesh = options.mesh;
  if (!mesh) throw InvalidArgumentError("fully_shard: options.mesh is null");
  const auto& dims = mesh->dim_names();
  auto pick = [&](const std::string& asked, const std::string& fallback) {
    if (!asked.empty() && !mesh->has_dim(asked)) {
      throw InvalidArgumentError("fully_shard: " + mesh->ToString() +
                                  " has no dimension '" + asked + "'");
    }
    return asked.empty() ? fallback : asked;
  };
  std::string shard_dim, replicate_dim;
  switch (options.strategy) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp:
      if (mesh->ndim() != 1 && options.shard_dim.empty()) {
        throw InvalidArgumentError(
            std::string("fully_shard: ") + ToString(options.strategy) +
            " needs a 1-D mesh or options.shard_dim; got " + mesh->ToString());
      }
      shard_dim = pick(options.shard_dim, dims.back());
      break;
    case ShardingStrategy::kNoShard:
      if (mesh->ndim() != 1 && options.replicate_dim.empty()) {
        throw InvalidArgumentError(
            "fully_shard: NO_SHARD needs a 1-D mesh or options.replicate_dim; "
            "got " + mesh->ToString());
      }
      replicate_dim = pick(options.replicate_dim, dims.front());
      break;
    case ShardingStrategy::kHybridShard:
      if (mesh->ndim() != 2) {
        throw InvalidArgumentError(
            "fully_shard: HYBRID_SHARD needs a 2-D mesh (replicate, shard); "
            "got " + mesh->ToString());
      }
      replicate_dim = pick(options.replicate_dim, dims.front());
      shard_dim = pick(options.shard_dim, dims.back());
      if (replicate_dim == shard_dim) {
        throw InvalidArgumentError(
            "fully_shard: HYBRID_SHARD needs distinct replicate and shard dims");
      }
      break;
  }
  Groups groups;
  groups.shard_dim = shard_dim;
  if (!shard_dim.empty() && mesh->size(shard_dim) > 1) {
    groups.shard = mesh->group(shard_dim);
  }
  if (!replicate_dim.empty() && mesh->size(replicate_dim) > 1) {
    groups.replicate = mesh->group(replicate_dim);
  }
  return groups;
}

// Calls fn(unsharded_part, kept_part) for each parameter with rows: the
// part of the unsharded buffer (`world` ranks, parameter-major) that this
// rank keeps after a partial reshard as member `member` of a block of
// world / `per_member` ranks, and its place in the kept buffer (each
// parameter at `per_member` times its flat offset).
template <typename Fn>
void ForEachBlockPart(const std::vector<FSDPParam>& params, const at::Tensor& unsharded,
                      const at::Tensor& kept, int64_t world, int64_t per_member,
                      int64_t member, Fn fn) {
  for (const FSDPParam& p : params) {
    const int64_t n = per_member * p.shard_numel();
    if (n == 0) continue;
    fn(unsharded.narrow(0, world * p.flat_offset() + member * n, n),
       kept.narrow(0, per_member * p.flat_offset(), n), per_member * p.flat_offset());
  }
}

}  // namespace

int64_t PeakUnshardedBytes() { return g_peak_unsharded_bytes.load(); }
void ResetPeakUnshardedBytes() {
  g_peak_unsharded_bytes.store(g_unsharded_bytes.load());
}

FSDPParamGroup::FSDPParamGroup(std::vector<FSDPParam> params,
                               const FSDPOptions& options)
    : params_(std::move(params)) {
  Groups groups = PickGroups(options);
  shard_group_ = std::move(groups.shard);
  replicate_group_ = std::move(groups.replicate);
  if (shard_group_) {
    shard_world_ = shard_group_->size();
    shard_rank_ = shard_group_->rank();
  }
  data_parallel_size_ =
      int64_t{shard_world_} * (replicate_group_ ? replicate_group_->size() : 1);
  set_gradient_divide_factor(options.gradient_divide_factor.value_or(
      static_cast<double>(data_parallel_size_)));
  const int block = options.reshard_after_forward_size;
  if (block < 0 || (block > 0 && shard_world_ % block != 0)) {
    throw InvalidArgumentError(
        "fully_shard: reshard_after_forward_size " + std::to_string(block) +
        " must be 0 or divide the shard group size " + std::to_string(shard_world_));
  }
  if (block > 1 && block < shard_world_) {
    post_forward_group_ = options.mesh->block_group(groups.shard_dim, block);
  }

  // dtypes and device: one flat buffer needs one of each.
  at::ScalarType own_dtype = at::kFloat;
  at::Device device(at::kCPU);
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i].compute();
    if (i == 0) {
      own_dtype = p.scalar_type();
      device = p.device();
    } else if (p.device() != device) {
      throw InvalidArgumentError(
          "fully_shard: parameters on different devices: '" +
          params_[0].name() + "' on " + device.str() + ", '" +
          params_[i].name() + "' on " + p.device().str());
    } else if (p.scalar_type() != own_dtype) {
      throw InvalidArgumentError(
          std::string("fully_shard: parameters of different dtypes: '") +
          params_[0].name() + "' is " + c10::toString(own_dtype) + ", '" +
          params_[i].name() + "' is " + c10::toString(p.scalar_type()) +
          "; convert the module to one dtype first");
    }
  }
  // Deferred (meta) parameters: compute on the device they will live on.
  if (!params_.empty() && params_[0].compute().is_meta()) {
    deferred_ = true;
    device = internal::DeferredDevice(params_[0].compute()).value_or(device);
  }
  param_dtype_ = options.mp_policy.param_dtype.value_or(own_dtype);
  reduce_dtype_ = options.mp_policy.reduce_dtype.value_or(param_dtype_);
  compute_options_ = at::TensorOptions().dtype(param_dtype_).device(device);
  offload_ = options.offload_policy.cpu_offload;
  pin_memory_ = options.offload_policy.pin_memory;
  // Offloaded shards live apart from what computes, also on the CPU.
  alias_shards_ = shard_world_ == 1 && param_dtype_ == own_dtype && !offload_;

  // The per-rank flat shard, parameter after parameter, and the shards.
  int64_t offset = 0;
  for (FSDPParam& p : params_) {
    p.init_layout(shard_world_, shard_rank_, offset);
    offset += p.shard_numel();
    has_padding_ = has_padding_ || p.padded(shard_world_);
    p.init_shard(compute_options_, offload_, pin_memory_);
  }
  flat_numel_ = offset;
  // Deferred: the buffer comes with the device, at set_device().
  if (!alias_shards_ && !deferred_) {
    // From the engine's pool: re-allocating its storage at each unshard
    // then reuses the buffer freed at the last reshard. As large as the
    // reduction input (its contribution flags included, the tail unused
    // here), so that either one's freed buffer serves the other.
    unsharded_ = internal::BufferPool::Get().empty(
        {shard_world_ * reduction_width()}, compute_options_);
    internal::FreeStorage(unsharded_);
  }
}

FSDPParamGroup::~FSDPParamGroup() {
  if (state_ == State::kPostForward) {
    AddUnshardedBytes(-post_forward_bytes());
  } else if (state_ != State::kSharded && !alias_shards_) {
    try {
      unshard_done_.wait();
    } catch (...) {
    }
    AddUnshardedBytes(-buffer_bytes());
  }
}

void FSDPParamGroup::set_device(const at::Device& device) {
  if (!deferred_ || state_ != State::kSharded) {
    throw FailedPreconditionError(
        "fully_shard: a unit's device can change only before its deferred "
        "parameters are materialised");
  }
  compute_options_ = compute_options_.device(device);
  for (FSDPParam& p : params_) p.free_compute(compute_options_);
  if (!alias_shards_) {
    unsharded_ = internal::BufferPool::Get().empty({shard_world_ * reduction_width()},
                                                   compute_options_);
    internal::FreeStorage(unsharded_);
  }
}

void FSDPParamGroup::set_gradient_divide_factor(double factor) {
  if (!(factor > 0) || !std::isfinite(factor)) {
    throw InvalidArgumentError(
        "fully_shard: gradient_divide_factor must be a positive number, got " +
        std::to_string(factor));
  }
  divide_factor_ = factor;
}

int64_t FSDPParamGroup::buffer_bytes() const {
  return alias_shards_ ? 0
                       : shard_world_ * flat_numel_ * c10::elementSize(param_dtype_);
}

int64_t FSDPParamGroup::unsharded_bytes() const {
  if (state_ == State::kPostForward) return post_forward_bytes();
  return state_ == State::kSharded ? 0 : buffer_bytes();
}

int64_t FSDPParamGroup::unsharded_grad_bytes() const {
  int64_t n = 0;
  for (const auto& g : no_sync_grads_) {
    if (g.defined()) n += g.nbytes();
  }
  return n;
}

// ---------------------------------------------------------------- unsharding

void FSDPParamGroup::unshard_async() {
  if (state_ == State::kPostForward) {
    // Back from the post-forward state: this rank's part returns to its
    // place, and the block group fills in the rest.
    internal::ReallocStorage(unsharded_, unsharded_.numel() * unsharded_.element_size());
    AddUnshardedBytes(buffer_bytes());
    std::vector<comm::ProcessGroup::Piece> pieces;
    ForEachBlockPart(params_, unsharded_, post_forward_, shard_world_,
                     shard_world_ / post_forward_group_->size(), post_forward_group_->rank(),
                     [&](const at::Tensor& part, const at::Tensor& kept, int64_t offset) {
                       part.copy_(kept);
                       pieces.push_back({offset, kept.numel()});
                     });
    AddUnshardedBytes(-post_forward_bytes());
    post_forward_ = at::Tensor();
    state_ = State::kUnshardPending;
    ++wait_stats_.all_gathers;
    unshard_done_ = post_forward_group_->all_gather_pieces(unsharded_, std::move(pieces));
    return;
  }
  if (state_ != State::kSharded) return;
  if (alias_shards_) {
    for (FSDPParam& p : params_) p.point_compute_at_shard();
    state_ = State::kUnsharded;
    return;
  }
  internal::ReallocStorage(unsharded_, unsharded_.numel() *
                                           unsharded_.element_size());
  AddUnshardedBytes(buffer_bytes());
  state_ = State::kUnshardPending;

  copy_in_and_all_gather();
}

void FSDPParamGroup::copy_in_and_all_gather() {
  // Copy-in straight into the unsharded buffer; the all-gather then fills
  // the other ranks' parts in place.
  const auto copy_start = std::chrono::steady_clock::now();
  ++wait_stats_.all_gathers;
  auto all_gather = [&](std::vector<comm::ProcessGroup::Piece> pieces) {
    AddSecondsSince(copy_start, wait_stats_.copy_in_s);
    unshard_done_ = shard_group_ ? shard_group_->all_gather_pieces(unsharded_, std::move(pieces))
                                 : comm::CommHandle();
  };
  if (!offload_) {
    all_gather(CopyInForAllGather(params_, unsharded_, shard_world_, shard_rank_));
    return;
  }
  // Offload: the shards to the device first (a copy of their own on the
  // CPU, which stands in for it), read by the copy-in there.
  const at::Device device = compute_options_.device();
  const c10::Stream copy = internal::CopyStream(device);
  // The buffer may still be read by work queued before it was freed.
  internal::WaitFor(copy, internal::CurrentStream(device));
  const c10::StreamGuard on_copy(copy);
  std::vector<at::Tensor> staged;
  staged.reserve(params_.size());
  for (const FSDPParam& p : params_) {
    // From page-locked memory an asynchronous copy; the staged tensors are
    // the copy stream's, so their memory is reused only after it.
    staged.push_back(p.shard().detach().to(p.shard().options().device(device),
                                           /*non_blocking=*/true, /*copy=*/true));
  }
  // Issued from the copy stream: a lane's collective waits for the stream
  // it was issued from.
  all_gather(CopyInForAllGather(params_, unsharded_, shard_world_, shard_rank_, &staged));
  staged_ = internal::RecordOn(copy);
}

void FSDPParamGroup::wait_staged() {
  if (!staged_) return;
  internal::Block(internal::CurrentStream(compute_options_.device()), staged_.get());
  staged_.reset();
}

void FSDPParamGroup::wait_unshard() {
  if (state_ == State::kSharded || state_ == State::kPostForward) unshard_async();
  if (state_ != State::kUnshardPending) return;
  comm::CommHandle done = unshard_done_;
  unshard_done_ = comm::CommHandle();
  WaitTimed(done, wait_stats_.all_gather_wait_s);
  wait_staged();
  for (FSDPParam& p : params_) {
    p.point_compute_at_unsharded(unsharded_, shard_world_);
  }
  state_ = State::kUnsharded;
}

void FSDPParamGroup::reshard() {
  if (alias_shards_ || state_ == State::kSharded) return;
  if (state_ == State::kPostForward) {
    AddUnshardedBytes(-post_forward_bytes());
    post_forward_ = at::Tensor();
    state_ = State::kSharded;
    return;
  }
  if (state_ == State::kUnshardPending) {
    comm::CommHandle done = unshard_done_;
    unshard_done_ = comm::CommHandle();
    // Never free memory a copy is still writing.
    WaitTimed(done, wait_stats_.all_gather_wait_s);
    wait_staged();
  }
  for (FSDPParam& p : params_) p.free_compute(compute_options_);
  AddUnshardedBytes(-buffer_bytes());
  internal::FreeStorage(unsharded_);
  state_ = State::kSharded;
}

void FSDPParamGroup::reshard_after_forward() {
  if (!post_forward_group_ || state_ == State::kSharded ||
      state_ == State::kPostForward) {
    reshard();
    return;
  }
  wait_unshard();
  // This rank's part for its block group: for each parameter, the rows of
  // the m consecutive shard ranks at its place in the group.
  const int64_t per_member = shard_world_ / post_forward_group_->size();
  post_forward_ = at::empty({per_member * flat_numel_}, compute_options_);
  ForEachBlockPart(params_, unsharded_, post_forward_, shard_world_, per_member,
                   post_forward_group_->rank(),
                   [](const at::Tensor& part, const at::Tensor& kept, int64_t) {
                     kept.copy_(part);
                   });
  for (FSDPParam& p : params_) p.free_compute(compute_options_);
  AddUnshardedBytes(post_forward_bytes() - buffer_bytes());
  internal::FreeStorage(unsharded_);
  state_ = State::kPostForward;
}

// ------------------------------------------------------------------ reducing

bool FSDPParamGroup::reduces() const {
  if (!requires_grad_sync_ || !has_peers()) return false;
  for (const FSDPParam& p : params_) {
    if (p.requires_grad()) return true;
  }
  return false;
}

at::Tensor FSDPParamGroup::prepare_reduction(std::vector<at::Tensor> grads) {
  const size_t n = params_.size();
  grads.resize(n);
  if (!requires_grad_sync_) {
    // Accumulate locally; a later synced backward reduces the sum.
    no_sync_grads_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (!grads[i].defined()) continue;
      if (no_sync_grads_[i].defined()) {
        no_sync_grads_[i].add_(grads[i].to(reduce_dtype_));
      } else {
        no_sync_grads_[i] =
            grads[i].to(reduce_dtype_, /*non_blocking=*/false, /*copy=*/true);
      }
    }
    return at::Tensor();
  }
  for (size_t i = 0; i < n; ++i) {
    if (i < no_sync_grads_.size() && no_sync_grads_[i].defined()) {
      grads[i] = grads[i].defined()
                     ? no_sync_grads_[i].add_(grads[i].to(reduce_dtype_))
                     : no_sync_grads_[i];
    }
  }
  no_sync_grads_.clear();

  const auto copy_start = std::chrono::steady_clock::now();
  if (!has_peers()) {
    // One rank and no replicas: nothing to reduce, so no flat buffer.
    for (size_t i = 0; i < n; ++i) {
      FSDPParam& p = params_[i];
      if (!grads[i].defined() || !p.requires_grad()) continue;
      at::Tensor g = grads[i].to(reduce_dtype_).reshape(p.shard().sizes());
      // The divisor a reduction over this one rank would apply.
      if (divide_factor_ != 1) g = g / divide_factor_;
      deliver_grad(i, g);
    }
    hand_over_host_grads();
    AddSecondsSince(copy_start, wait_stats_.copy_in_s);
    return at::Tensor();
  }
  if (!reduces()) return at::Tensor();  // frozen: nothing to reduce
  local_grads_.assign(n, false);
  for (size_t i = 0; i < n; ++i) local_grads_[i] = grads[i].defined();
  at::Tensor input =
      CopyInForReduce(params_, grads, shard_world_, flat_numel_, has_padding_,
                      compute_options_.dtype(reduce_dtype_));
  AddSecondsSince(copy_start, wait_stats_.copy_in_s);
  ++wait_stats_.reductions;
  return input;
}

void FSDPParamGroup::flush_local_grads() {
  if (requires_grad_sync_ && !no_sync_grads_.empty() && !has_peers()) {
    prepare_reduction({});
  }
}

void FSDPParamGroup::start_reduction(at::Tensor input) {
  // With replicas and all-reduce off, the all-reduce waits for a later
  // reduction (set_requires_all_reduce); that one takes the sum so far.
  reduction_is_partial_ = replicate_group_ != nullptr && !requires_all_reduce_;
  if (reduction_is_partial_ && !shard_group_) {
    // Replicas only: this rank's row is its whole part, nothing to send.
    reduction_.output = input.narrow(0, 0, reduction_width()).div_(divide_factor_);
    reduction_.done = comm::CommHandle();
  } else if (reduction_is_partial_) {
    reduction_ = ReduceGrads(std::move(input), reduction_width(), shard_group_,
                             nullptr, divide_factor_);
  } else {
    reduction_ = ReduceGrads(std::move(input), reduction_width(), shard_group_,
                             replicate_group_, divide_factor_, std::move(partial_));
    partial_ = at::Tensor();
  }
  reduction_pending_ = true;
  reduction_local_grads_ = std::move(local_grads_);
  local_grads_.clear();
}

void FSDPParamGroup::finish_reduction() {
  if (!reduction_pending_) return;
  reduction_pending_ = false;
  PendingReduction reduction = std::move(reduction_);
  reduction_ = PendingReduction();
  WaitTimed(reduction.done, wait_stats_.reduce_wait_s);
  if (reduction_is_partial_) {
    // Held back for the all-reduce; the .grad of the shards waits too.
    if (partial_.defined()) {
      partial_.add_(reduction.output);
    } else {
      partial_ = reduction.output.clone();
    }
    reduction_local_grads_.clear();
    return;
  }
  // The contribution flags, summed over the ranks and divided like the
  // gradients: positive where some rank had a gradient. Read only for the
  // parameters without one here (a parameter this rank's step did not use).
  std::vector<bool> local = std::move(reduction_local_grads_);
  reduction_local_grads_.clear();
  local.resize(params_.size(), false);
  at::Tensor contributed;
  for (size_t i = 0; i < params_.size(); ++i) {
    FSDPParam& p = params_[i];
    if (!p.requires_grad()) continue;
    if (!local[i]) {
      if (!contributed.defined()) {
        contributed = reduction.output.narrow(0, flat_numel_, params_.size())
                          .to(at::kCPU, at::kDouble).contiguous();
      }
      if (contributed.data_ptr<double>()[i] <= 0) continue;
    }
    deliver_grad(i, p.reduced_grad_view(reduction.output));
  }
  hand_over_host_grads();
}

void FSDPParamGroup::deliver_grad(size_t i, const at::Tensor& grad) {
  if (!offload_) {
    params_[i].accumulate_grad(grad);
    return;
  }
  // A buffer of its own (the reduction's is reused by the next unit); on
  // the CPU it is the host gradient itself.
  device_grads_.emplace_back(i, grad.clone(at::MemoryFormat::Contiguous));
}

void FSDPParamGroup::hand_over_host_grads() {
  if (!offload_) return;
  std::vector<at::Tensor> trainable;
  for (const FSDPParam& p : params_) {
    if (p.requires_grad()) trainable.push_back(p.shard());
  }
  const at::Device device = compute_options_.device();
  auto batch = std::make_shared<HostGradients>(std::move(trainable), device);
  if (device.is_cpu()) {
    for (auto& [i, grad] : device_grads_) batch->add(params_[i].shard(), std::move(grad));
  } else if (!device_grads_.empty()) {
    const c10::Stream copy = internal::CopyStream(device);
    internal::WaitFor(copy, internal::CurrentStream(device));  // the gradients are computed
    const c10::StreamGuard on_copy(copy);
    for (auto& [i, grad] : device_grads_) {
      at::Tensor host = internal::EmptyHost(
          grad.sizes(), grad.options().pinned_memory(pin_memory_));
      host.copy_(grad, /*non_blocking=*/true);
      internal::RecordStream(grad, copy);  // read there: not reused before
      batch->add(params_[i].shard(), std::move(host));
    }
    batch->copied(copy);
  }
  device_grads_.clear();
  if (sink_) {
    sink_(std::move(batch));
  } else {
    batch->apply();
  }
}

}  // namespace fsdp
}  // namespace fsdp2
