#include "core/fsdp/fsdp_unit.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <sstream>
#include <stdexcept>

#include "core/fsdp/deferred_init.h"
#include "core/fsdp/internal/module_access.h"
#include "core/fsdp/internal/storage.h"

namespace fsdp2 {
namespace fsdp {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;

std::atomic<int64_t> g_unsharded_bytes{0};
std::atomic<int64_t> g_peak_unsharded_bytes{0};

void AddUnshardedBytes(int64_t delta) {
  int64_t now = g_unsharded_bytes.fetch_add(delta) + delta;
  int64_t peak = g_peak_unsharded_bytes.load();
  while (now > peak && !g_peak_unsharded_bytes.compare_exchange_weak(peak, now)) {
  }
}

// Receives the gradients of every parameter of one unit (one input each) and
// fires once all of them are computed: the unit's post-backward.
class PostBackwardNode : public Node {
 public:
  explicit PostBackwardNode(std::weak_ptr<FSDPUnit> unit)
      : unit_(std::move(unit)) {}
  std::string name() const override { return "fsdp2::PostBackward"; }

 protected:
  variable_list apply(variable_list&& grads) override {
    if (auto unit = unit_.lock()) unit->post_backward(this, std::move(grads));
    return {};
  }

 private:
  std::weak_ptr<FSDPUnit> unit_;
};

// Identity on a unit's outputs whose backward runs the unit's pre-backward
// (all-gather again) before any gradient flows into the unit.
struct PreBackwardFunction
    : public torch::autograd::Function<PreBackwardFunction> {
  // `outputs` must arrive as a TensorList: a std::vector argument would be
  // taken for a non-tensor and the outputs would lose their history.
  static variable_list forward(torch::autograd::AutogradContext* ctx,
                               at::TensorList outputs, int64_t unit) {
    ctx->saved_data["unit"] = unit;
    return outputs.vec();
  }
  static variable_list backward(torch::autograd::AutogradContext* ctx,
                                variable_list grads) {
    reinterpret_cast<FSDPUnit*>(ctx->saved_data["unit"].toInt())
        ->pre_backward();
    grads.emplace_back();  // for the `unit` argument
    return grads;
  }
};

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

// Adds `g` to the shard's .grad, or makes .grad a contiguous copy of it in
// the shard's dtype: a tensor of our own, not a view of a flat buffer or of
// a gradient autograd may hand to other nodes (zero_grad() detaches .grad
// in place, which a view refuses).
void AccumulateShardGrad(FSDPParam& p, const at::Tensor& g) {
  at::Tensor& grad = p.shard.mutable_grad();
  if (grad.defined()) {
    grad.add_(g);
  } else {
    grad = g.to(p.shard.scalar_type(), /*non_blocking=*/false, /*copy=*/true,
                at::MemoryFormat::Contiguous);
  }
}

std::vector<int64_t> Tail(const std::vector<int64_t>& shape) {
  return shape.empty() ? std::vector<int64_t>{}
                       : std::vector<int64_t>(shape.begin() + 1, shape.end());
}

std::vector<int64_t> WithRows(int64_t rows, const std::vector<int64_t>& shape) {
  std::vector<int64_t> out{rows};
  auto tail = Tail(shape);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

}  // namespace

int64_t PeakUnshardedBytes() { return g_peak_unsharded_bytes.load(); }
void ResetPeakUnshardedBytes() {
  g_peak_unsharded_bytes.store(g_unsharded_bytes.load());
}

FSDPUnit::FSDPUnit(const std::shared_ptr<torch::nn::Module>& module,
                   const FSDPOptions& options, std::vector<FSDPParam> params)
    : module_(module.get()),
      module_alive_(module),
      options_(options),
      params_(std::move(params)) {
  const auto& mesh = options_.mesh;
  if (!mesh) throw std::invalid_argument("fully_shard: options.mesh is null");
  const auto& dims = mesh->dim_names();
  auto pick = [&](const std::string& asked, const std::string& fallback) {
    if (!asked.empty() && !mesh->has_dim(asked)) {
      throw std::invalid_argument("fully_shard: " + mesh->ToString() +
                                  " has no dimension '" + asked + "'");
    }
    return asked.empty() ? fallback : asked;
  };
  std::string shard_dim, replicate_dim;
  switch (options_.strategy) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kShardGradOp:
      if (mesh->ndim() != 1 && options_.shard_dim.empty()) {
        throw std::invalid_argument(
            std::string("fully_shard: ") + ToString(options_.strategy) +
            " needs a 1-D mesh or options.shard_dim; got " + mesh->ToString());
      }
      shard_dim = pick(options_.shard_dim, dims.back());
      break;
    case ShardingStrategy::kNoShard:
      if (mesh->ndim() != 1 && options_.replicate_dim.empty()) {
        throw std::invalid_argument(
            "fully_shard: NO_SHARD needs a 1-D mesh or options.replicate_dim; "
            "got " + mesh->ToString());
      }
      replicate_dim = pick(options_.replicate_dim, dims.front());
      break;
    case ShardingStrategy::kHybridShard:
      if (mesh->ndim() != 2) {
        throw std::invalid_argument(
            "fully_shard: HYBRID_SHARD needs a 2-D mesh (replicate, shard); "
            "got " + mesh->ToString());
      }
      replicate_dim = pick(options_.replicate_dim, dims.front());
      shard_dim = pick(options_.shard_dim, dims.back());
      if (replicate_dim == shard_dim) {
        throw std::invalid_argument(
            "fully_shard: HYBRID_SHARD needs distinct replicate and shard dims");
      }
      break;
  }
  if (!shard_dim.empty() && mesh->size(shard_dim) > 1) {
    shard_group_ = mesh->group(shard_dim);
    shard_world_ = shard_group_->size();
    shard_rank_ = shard_group_->rank();
  }
  if (!replicate_dim.empty() && mesh->size(replicate_dim) > 1) {
    replicate_group_ = mesh->group(replicate_dim);
  }
  data_parallel_size_ =
      int64_t{shard_world_} * (replicate_group_ ? replicate_group_->size() : 1);
  reshard_after_forward_ = options_.reshard_after_forward.value_or(
      options_.strategy == ShardingStrategy::kFullShard ||
      options_.strategy == ShardingStrategy::kHybridShard);

  // dtypes and device: one flat buffer needs one of each.
  at::ScalarType own_dtype = at::kFloat;
  at::Device device(at::kCPU);
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i].compute;
    if (i == 0) {
      own_dtype = p.scalar_type();
      device = p.device();
    } else if (p.device() != device) {
      throw std::invalid_argument(
          "fully_shard: parameters on different devices: '" +
          params_[0].name + "' on " + device.str() + ", '" + params_[i].name +
          "' on " + p.device().str());
    } else if (p.scalar_type() != own_dtype) {
      throw std::invalid_argument(
          std::string("fully_shard: parameters of different dtypes: '") +
          params_[0].name + "' is " + c10::toString(own_dtype) + ", '" +
          params_[i].name + "' is " + c10::toString(p.scalar_type()) +
          "; convert the module to one dtype first");
    }
  }
  // Deferred (meta) parameters: compute on the device they will live on.
  if (!params_.empty() && params_[0].compute.is_meta()) {
    deferred_ = true;
    device = internal::DeferredDevice(params_[0].compute).value_or(device);
  }
  param_dtype_ = options_.mp_policy.param_dtype.value_or(own_dtype);
  reduce_dtype_ = options_.mp_policy.reduce_dtype.value_or(param_dtype_);
  compute_options_ = at::TensorOptions().dtype(param_dtype_).device(device);
  alias_shards_ = shard_world_ == 1 && param_dtype_ == own_dtype;

  // Layout of the per-rank flat shard and the shards themselves.
  const int64_t world = shard_world_;
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    FSDPParam& p = params_[i];
    at::Tensor full = p.compute.detach();
    p.global_shape = full.sizes().vec();
    p.rows = full.dim() == 0 ? 1 : full.size(0);
    p.row_numel = p.rows == 0 ? 0 : full.numel() / p.rows;
    if (full.dim() > 0 && p.rows == 0) {
      int64_t n = 1;
      for (size_t d = 1; d < p.global_shape.size(); ++d) n *= p.global_shape[d];
      p.row_numel = n;
    }
    p.shard_rows = (p.rows + world - 1) / world;
    const int64_t start = std::min(shard_rank_ * p.shard_rows, p.rows);
    p.local_rows = std::min(p.shard_rows, p.rows - start);
    p.row_start = start;
    p.flat_offset = offset;
    offset += p.shard_numel();
    has_padding_ = has_padding_ || p.shard_rows * world != p.rows;
    p.requires_grad = p.compute.requires_grad();
    if (p.requires_grad) grad_params_.push_back(i);

    at::Tensor shard = full.reshape({p.rows, p.row_numel})
                           .narrow(0, start, p.local_rows)
                           .clone()
                           .view(WithRows(p.local_rows, p.global_shape));
    shard.set_requires_grad(p.requires_grad);
    p.shard = shard;
    for (auto& slot : p.slots) {
      internal::ModuleAccess::Parameters(*slot.first)[slot.second] = shard;
    }
    p.compute.set_requires_grad(false);
    internal::AssignData(p.compute, at::empty({0}, compute_options_));
  }
  flat_numel_ = offset;
  if (!alias_shards_) {
    unsharded_ = at::empty({world * flat_numel_}, compute_options_);
    internal::FreeStorage(unsharded_);
  }
}

FSDPUnit::~FSDPUnit() {
  if (state_ != State::kSharded && !alias_shards_) {
    try {
      unshard_done_.wait();
    } catch (...) {
    }
    AddUnshardedBytes(-buffer_bytes());
  }
}

int64_t FSDPUnit::buffer_bytes() const {
  return alias_shards_ ? 0
                       : shard_world_ * flat_numel_ * c10::elementSize(param_dtype_);
}

int64_t FSDPUnit::unsharded_bytes() const {
  return state_ == State::kSharded ? 0 : buffer_bytes();
}

int64_t FSDPUnit::unsharded_grad_bytes() const {
  int64_t n = 0;
  for (const auto& g : no_sync_grads_) {
    if (g.defined()) n += g.nbytes();
  }
  return n;
}

std::vector<FSDPUnit*> UnitsUnder(torch::nn::Module& root) {
  std::vector<FSDPUnit*> units;
  for (const auto& m : root.modules(/*include_self=*/true)) {
    if (auto unit = unit_of(*m)) units.push_back(unit.get());
  }
  return units;
}

std::vector<FSDPUnit*> FSDPUnit::units_in_tree() const {
  auto alive = module_alive_.lock();
  return alive ? UnitsUnder(*alive) : std::vector<FSDPUnit*>{};
}

// ---------------------------------------------------------------- unsharding

void FSDPUnit::unshard_async() {
  if (state_ != State::kSharded) return;
  if (alias_shards_) {
    for (auto& p : params_) {
      p.compute.set_data(p.shard.detach().view(p.global_shape));
    }
    state_ = State::kUnsharded;
    return;
  }
  internal::ReallocStorage(unsharded_, unsharded_.numel() *
                                           unsharded_.element_size());
  AddUnshardedBytes(buffer_bytes());
  state_ = State::kUnshardPending;

  // Copy-in: this rank's shards, cast to param_dtype, straight into their
  // place in the unsharded buffer (zero padding); the all-gather then fills
  // the other ranks' parts in place.
  const auto copy_start = std::chrono::steady_clock::now();
  const int64_t world = shard_world_;
  std::vector<comm::ProcessGroup::Piece> pieces;
  pieces.reserve(params_.size());
  for (const auto& p : params_) {
    const int64_t numel = p.shard_numel();
    if (numel == 0) continue;
    at::Tensor mine =
        unsharded_.narrow(0, world * p.flat_offset + shard_rank_ * numel, numel);
    const int64_t local = p.local_numel();
    if (local > 0) mine.narrow(0, 0, local).copy_(p.shard.detach().reshape({-1}));
    if (local < numel) mine.narrow(0, local, numel - local).zero_();
    pieces.push_back({p.flat_offset, numel});
  }
  AddSecondsSince(copy_start, wait_stats_.copy_in_s);
  ++wait_stats_.all_gathers;
  unshard_done_ = shard_group_ ? shard_group_->all_gather_pieces(
                                     unsharded_, std::move(pieces))
                               : comm::CommHandle();
}

void FSDPUnit::wait_unshard() {
  if (state_ == State::kSharded) unshard_async();
  if (state_ != State::kUnshardPending) return;
  comm::CommHandle done = unshard_done_;
  unshard_done_ = comm::CommHandle();
  WaitTimed(done, wait_stats_.all_gather_wait_s);
  const int64_t world = shard_world_;
  for (auto& p : params_) {
    p.compute.set_data(
        unsharded_.narrow(0, world * p.flat_offset, world * p.shard_numel())
            .view(WithRows(world * p.shard_rows, p.global_shape))
            .narrow(0, 0, p.rows)
            .view(p.global_shape));
  }
  state_ = State::kUnsharded;
}

void FSDPUnit::reshard() {
  if (alias_shards_ || state_ == State::kSharded) return;
  if (state_ == State::kUnshardPending) {
    comm::CommHandle done = unshard_done_;
    unshard_done_ = comm::CommHandle();
    // Never free memory a copy is still writing.
    WaitTimed(done, wait_stats_.all_gather_wait_s);
  }
  for (auto& p : params_) p.compute.set_data(at::empty({0}, compute_options_));
  AddUnshardedBytes(-buffer_bytes());
  internal::FreeStorage(unsharded_);
  state_ = State::kSharded;
}

void FSDPUnit::prefetch(int direction) {
  if (root_ == nullptr) return;
  // Forward follows the previous pass's pre-forward order. Backward runs in
  // reverse post-forward order, in which the root (whose forward ends last)
  // comes first and is followed by the last block: walking the pre-forward
  // order instead would prefetch nothing from the root.
  const auto& order =
      direction > 0 ? root_->last_forward_order_ : root_->post_forward_order_;
  auto it = std::find(order.begin(), order.end(), this);
  if (it == order.end()) return;
  const auto index = (it - order.begin()) + direction;
  if (index < 0 || index >= static_cast<int64_t>(order.size())) return;
  order[index]->unshard_async();
}

// ------------------------------------------------------------------- forward

void FSDPUnit::lazy_init_as_root() {
  is_root_ = true;
  root_ = this;
  if (!options_.reshard_after_forward.has_value()) {
    reshard_after_forward_ = false;  // its backward starts right away
  }
  all_units_ = units_in_tree();
  for (FSDPUnit* unit : all_units_) {
    if (unit == this) continue;
    unit->is_root_ = false;  // it may have run alone before
    unit->root_ = this;
  }
}

void FSDPUnit::pre_forward() {
  if (deferred_) {
    throw std::logic_error(
        "fsdp::forward: the parameters of '" + module_->name() + "' are still "
        "on the meta device (built under tensor_init_context()); call "
        "fsdp::materialize_module(root) or FSDP2Strategy::parallelize() first");
  }
  if (root_ == nullptr) lazy_init_as_root();  // the first unit entered
  if (is_root_) {
    if (!forward_order_.empty()) last_forward_order_ = forward_order_;
    forward_order_.clear();
    post_forward_order_.clear();
  }
  auto& order = root_->forward_order_;
  if (std::find(order.begin(), order.end(), this) == order.end()) {
    order.push_back(this);
  }
  wait_unshard();
  prefetch(+1);
  if (at::GradMode::is_enabled() && !grad_params_.empty()) attach_grad_node();
}

at::Tensor FSDPUnit::cast_input(const at::Tensor& t) const {
  const auto& mp = options_.mp_policy;
  if (!mp.cast_forward_inputs || !mp.param_dtype.has_value() ||
      !t.defined() || !t.is_floating_point() ||
      t.scalar_type() == *mp.param_dtype) {
    return t;
  }
  return t.to(*mp.param_dtype);
}

void FSDPUnit::attach_grad_node() {
  if (grad_node_ && !grad_node_fired_) return;  // one node per backward
  grad_node_ = std::make_shared<PostBackwardNode>(weak_from_this());
  grad_node_fired_ = false;
  pre_backward_done_ = false;
  for (size_t i : grad_params_) {
    FSDPParam& p = params_[i];
    const uint32_t input_nr = grad_node_->add_input_metadata(p.compute);
    torch::autograd::impl::set_gradient_edge(p.compute,
                                             Edge(grad_node_, input_nr));
  }
}

std::vector<at::Tensor> FSDPUnit::post_forward(
    std::vector<at::Tensor> outputs) {
  const bool grad = at::GradMode::is_enabled();
  if (root_ != nullptr) {
    auto& order = root_->post_forward_order_;
    if (std::find(order.begin(), order.end(), this) == order.end()) {
      order.push_back(this);
    }
  }
  if (reshard_after_forward_ || !grad) reshard();
  const auto& dtype = options_.mp_policy.output_dtype;
  if (is_root_ && dtype.has_value()) {
    for (auto& t : outputs) {
      if (t.defined() && t.is_floating_point()) t = t.to(*dtype);
    }
  }
  if (!grad) return outputs;
  std::vector<size_t> which;
  variable_list hooked;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && outputs[i].requires_grad()) {
      which.push_back(i);
      hooked.push_back(outputs[i]);
    }
  }
  if (hooked.empty()) return outputs;
  hooked = PreBackwardFunction::apply(at::TensorList(hooked),
                                      reinterpret_cast<int64_t>(this));
  for (size_t k = 0; k < which.size(); ++k) outputs[which[k]] = hooked[k];
  return outputs;
}

void FSDPUnit::abort_forward() {
  // Leave no half-done state behind: the next step starts from shards.
  reshard();
}

// ------------------------------------------------------------------ backward

void FSDPUnit::queue_finalize() {
  FSDPUnit* root = root_ != nullptr ? root_ : this;
  if (root->finalize_queued_) return;
  root->finalize_queued_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback(
      [root] { root->finalize_backward(); });
}

void FSDPUnit::pre_backward() {
  queue_finalize();
  if (pre_backward_done_) return;
  pre_backward_done_ = true;
  wait_unshard();  // all-gather again if resharded after forward
  prefetch(-1);    // the unit whose backward comes next
}

void FSDPUnit::post_backward(const Node* node,
                             std::vector<at::Tensor> grads) {
  if (node != grad_node_.get() || grad_node_fired_) return;  // stale graph
  grad_node_fired_ = true;
  queue_finalize();
  std::vector<at::Tensor> by_param(params_.size());
  for (size_t k = 0; k < grad_params_.size() && k < grads.size(); ++k) {
    by_param[grad_params_[k]] = std::move(grads[k]);
  }
  grads.clear();
  // The unsharded parameters are done with once their gradients exist:
  // free them before the reduction buffer is allocated, not after.
  reshard();
  reduce_grads(std::move(by_param));
}

void FSDPUnit::reduce_grads(std::vector<at::Tensor> grads) {
  const size_t n = params_.size();
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
    return;
  }
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    if (i < no_sync_grads_.size() && no_sync_grads_[i].defined()) {
      grads[i] = grads[i].defined()
                     ? no_sync_grads_[i].add_(grads[i].to(reduce_dtype_))
                     : no_sync_grads_[i];
    }
    any = any || grads[i].defined();
  }
  no_sync_grads_.clear();
  if (!any) return;  // nothing reached this unit: no communication

  if (!shard_group_ && !replicate_group_) {
    // One rank and no replicas: nothing to reduce, so no flat buffer; each
    // gradient goes to its shard's .grad with the casts a reduction would do.
    const auto copy_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      FSDPParam& p = params_[i];
      if (!grads[i].defined() || !p.requires_grad) continue;
      AccumulateShardGrad(
          p, grads[i].to(reduce_dtype_).reshape(p.shard.sizes()));
    }
    AddSecondsSince(copy_start, wait_stats_.copy_in_s);
    return;
  }

  // Copy-in: rank-major [world, flat] in reduce_dtype, zero padding.
  const auto copy_start = std::chrono::steady_clock::now();
  const int64_t world = shard_world_, flat = flat_numel_;
  auto reduce_options = compute_options_.dtype(reduce_dtype_);
  at::Tensor reduce_input = at::empty({world * flat}, reduce_options);
  bool all_defined = true;
  for (const auto& g : grads) all_defined = all_defined && g.defined();
  if (has_padding_ || !all_defined) reduce_input.zero_();
  auto by_rank = reduce_input.view({world, flat});
  for (size_t i = 0; i < n; ++i) {
    if (!grads[i].defined()) continue;
    const FSDPParam& p = params_[i];
    const int64_t numel = p.shard_numel();
    if (numel == 0) continue;
    at::Tensor g = grads[i].reshape({-1});
    auto target = by_rank.narrow(1, p.flat_offset, numel);
    const int64_t full_chunks = p.rows / p.shard_rows;
    const int64_t rest = p.rows * p.row_numel - full_chunks * numel;
    if (full_chunks > 0) {
      target.narrow(0, 0, full_chunks)
          .copy_(g.narrow(0, 0, full_chunks * numel).view({full_chunks, numel}));
    }
    if (rest > 0) {
      target[full_chunks].narrow(0, 0, rest).copy_(
          g.narrow(0, full_chunks * numel, rest));
    }
    g = at::Tensor();
    grads[i] = at::Tensor();  // copied: let it go while the rest are copied
  }

  AddSecondsSince(copy_start, wait_stats_.copy_in_s);
  ++wait_stats_.reductions;

  // Bound the reductions in flight: each holds a unit-sized input buffer, and
  // a backward that outruns the gradient lane would otherwise keep one per
  // unit alive (measured: ~240 MiB extra per rank on a 40M-parameter GPT).
  // Past the cap, the oldest reduction is finished: its unit waits for it,
  // writes its shards' .grad and drops its buffers, so the reduced
  // gradients of earlier units do not pile up until the end of backward.
  FSDPUnit* root = root_ != nullptr ? root_ : this;
  while (root->reductions_in_flight_.size() >= kMaxReductionsInFlight) {
    FSDPUnit* oldest = root->reductions_in_flight_.front();
    root->reductions_in_flight_.pop_front();
    oldest->finish_reduction();
  }

  const double dp = static_cast<double>(data_parallel_size_);
  auto replicate = replicate_group_;
  if (!shard_group_) {
    reduced_grads_ = reduce_input;
    if (replicate) {
      replicate->all_reduce(reduced_grads_, comm::ReduceOp::kSum,
                            comm::Lane::kGradient);
      reduce_done_ = replicate->submit(
          comm::Lane::kGradient, [out = reduced_grads_, dp] { out.div_(dp); });
    } else {
      reduce_done_ = comm::CommHandle();
    }
  } else {
    reduced_grads_ = at::empty({flat}, reduce_options);
    comm::CommHandle scattered =
        shard_group_->reduce_scatter_flat(reduced_grads_, reduce_input);
    reduce_done_ = shard_group_->submit(
        comm::Lane::kGradient,
        [scattered, out = reduced_grads_, replicate, dp] {
          scattered.wait();
          if (replicate) {
            replicate->all_reduce(out, comm::ReduceOp::kSum,
                                  comm::Lane::kGradient)
                .wait();
          }
          out.div_(dp);
        });
  }
  reduction_pending_ = true;
  root->reductions_in_flight_.push_back(this);
}

void FSDPUnit::finish_reduction() {
  if (!reduction_pending_) return;
  reduction_pending_ = false;
  comm::CommHandle done = reduce_done_;
  reduce_done_ = comm::CommHandle();
  at::Tensor reduced = std::move(reduced_grads_);
  WaitTimed(done, wait_stats_.reduce_wait_s);
  for (auto& p : params_) {
    if (!p.requires_grad) continue;
    AccumulateShardGrad(p, reduced.narrow(0, p.flat_offset, p.local_numel())
                               .view(p.shard.sizes()));
  }
}

void FSDPUnit::finalize_backward() {
  finalize_queued_ = false;
  reductions_in_flight_.clear();
  for (FSDPUnit* unit : all_units_) {
    unit->finish_reduction();
    unit->reshard();
    for (auto& p : unit->params_) {
      torch::autograd::impl::set_gradient_edge(p.compute, Edge());
    }
    unit->grad_node_.reset();
    unit->grad_node_fired_ = false;
    unit->pre_backward_done_ = false;
  }
}

}  // namespace fsdp
}  // namespace fsdp2
