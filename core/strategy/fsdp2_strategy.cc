#include "core/strategy/fsdp2_strategy.h"
#include "core/common/error.h"

#include <filesystem>

#include "core/fsdp/unit_plan.h"
#include "core/strategy/device.h"
#include "core/strategy/fsdp_controls.h"
#include "core/strategy/option_table.h"
#include "core/launch/allocator.h"
#include "core/launch/local_launcher.h"
#include "core/tp/clip_grad.h"
#include "core/tp/parallelize.h"
#include "core/tp/state_dict.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

namespace fsdp2 {
namespace strategy {

ParallelSize ParallelSize::Parse(const std::string& text) {
  if (text == "auto") return Auto();
  try {
    size_t used = 0;
    const int n = std::stoi(text, &used);
    if (used == text.size()) return Of(n);
  } catch (const std::exception&) {
  }
  throw InvalidArgumentError("parallel size must be \"auto\" or a number, got '" +
                              text + "'");
}

std::string ParallelSize::ToString() const {
  return value ? std::to_string(*value) : "auto";
}

fsdp::MixedPrecisionPolicy DefaultMixedPrecision() {
  fsdp::MixedPrecisionPolicy mp;
  mp.param_dtype = at::kBFloat16;
  mp.reduce_dtype = at::kFloat;
  mp.output_dtype = at::kFloat;
  return mp;
}

namespace {

// The first rank of each host (as found at rendezvous) says when its
// process lacks what matters most of the local launcher's rank environment
// (launch::CpuPerformanceEnv): the allocator. A rank an outside
// launcher started in Python, Java or C loaded it before fsdp2 could act,
// so unlike the main job it does not restart itself with them unless it
// calls fsdp2_restart_with_rank_environment.
void WarnIfRankEnvironmentIsMissing(const comm::World& world) {
  const auto& hosts = world.hosts();
  const auto first_here = std::find(hosts.begin(), hosts.end(), hosts[world.rank()]);
  if (first_here - hosts.begin() != world.rank()) return;
  const auto env = launch::CpuPerformanceEnv();
  const auto preload = env.find("LD_PRELOAD");
  if (preload != env.end()) {
    const std::string active = launch::ActiveAllocator();
    std::cerr << "fsdp2: warning: this process runs with "
              << (active == "system" ? "glibc's malloc, which hands large freed blocks back "
                                       "to the kernel and faults them in again every step "
                                       "(docs/main-job.md, \"The runtime environment\"),"
                                     : active)
              << " instead of " << launch::RequestedAllocator()
              << "; start it with LD_PRELOAD=" << preload->second
              << " as fsdp2's local launcher does (or call "
                 "fsdp2_restart_with_rank_environment(), Python: "
                 "fsdp2.restart_with_rank_environment(), first thing), or set "
                 "FSDP2_ALLOCATOR=system to silence this\n";
  }
}

}  // namespace

void DefaultParallelize(const std::shared_ptr<torch::nn::Module>& model,
                        const fsdp::FSDPOptions& options) {
  const auto& mesh = options.mesh;
  if (mesh && mesh->has_dim("tp") && mesh->size("tp") > 1) {
    const int tp_size = mesh->size("tp");
    auto* provider = dynamic_cast<tp::TensorParallelPlanProvider*>(model.get());
    if (provider == nullptr) {
      throw InvalidArgumentError(
          "FSDP2Strategy: tensor_parallel_size " + std::to_string(tp_size) +
          " needs a tensor-parallel plan, but the model '" + model->name() +
          "' does not implement tp::TensorParallelPlanProvider; implement it, "
          "pass a parallelize_fn that calls tp::parallelize_module, or use "
          "tensor_parallel_size = 1");
    }
    tp::parallelize_module(model, mesh->group("tp"),
                           provider->tensor_parallel_plan(tp_size));
  }
  if (auto* plan = dynamic_cast<fsdp::UnitPlanProvider*>(model.get())) {
    for (const auto& unit : plan->fsdp_unit_plan()) {
      if (!fsdp::unit_of(*unit)) fsdp::fully_shard(unit, options);
    }
    fsdp::fully_shard(model, options);
    return;
  }
  // Lists deeper in the tree come later in modules(); shard them first so
  // units are applied bottom-up.
  std::vector<std::shared_ptr<torch::nn::Module>> lists;
  for (const auto& m : model->modules(/*include_self=*/true)) {
    if (dynamic_cast<torch::nn::ModuleListImpl*>(m.get()) != nullptr) {
      lists.push_back(m);
    }
  }
  for (auto it = lists.rbegin(); it != lists.rend(); ++it) {
    for (const auto& block : (*it)->children()) {
      if (!fsdp::unit_of(*block)) fsdp::fully_shard(block, options);
    }
  }
  fsdp::fully_shard(model, options);
}

DataLoader::DataLoader(Batch dataset, DistributedSampler sampler)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)) {}

Batch DataLoader::batch(int64_t index) const {
  const std::vector<int64_t> rows = sampler_.local_batch(index);
  at::Tensor idx = at::tensor(rows, at::kLong);
  Batch out;
  for (const auto& t : dataset_) out.push_back(t.index_select(0, idx));
  return out;
}

FSDP2Strategy::FSDP2Strategy(FSDP2StrategyOptions options)
    : options_(std::move(options)),
      profiler_(options_.profile_steps, options_.profile_wait_steps, options_.profile_path) {
  // Every option's check, as every front end runs it (option_table.h).
  CheckOptions(StrategyOptionTable(), options_, "FSDP2Strategy: ");
}

FSDP2Strategy::~FSDP2Strategy() {
  // The module may outlive the strategy: its units must not keep handing
  // gradients to the host optimizer about to go.
  if (host_optimizer_ && module_ && module_->module()) {
    host_optimizer_->drain();
    fsdp::set_host_gradient_sink(*module_->module(), nullptr);
  }
}

void FSDP2Strategy::require(bool setup, bool parallelized,
                            const char* what) const {
  if (setup && !world_) {
    throw FailedPreconditionError(std::string("FSDP2Strategy::") + what +
                           ": call setup_environment() first");
  }
  if (parallelized && !parallelized_) {
    throw FailedPreconditionError(std::string("FSDP2Strategy::") + what +
                           ": call connect() and parallelize() first");
  }
}

void FSDP2Strategy::require_optimizer(const char* what) const {
  require(/*setup=*/true, /*parallelized=*/true, what);
  if (!optimizer_) {
    throw FailedPreconditionError(std::string("FSDP2Strategy::") + what +
                           ": the strategy was torn down (teardown() dropped the "
                           "optimizer); create a new strategy to train again");
  }
}

void FSDP2Strategy::setup_environment() {
  if (world_) throw FailedPreconditionError("FSDP2Strategy: setup_environment() was already called");
  cluster_ = ClusterEnvironment::Detect();
  const int world = cluster_.world_size;
  // "auto" (see FSDP2StrategyOptions): both auto is plain data parallelism;
  // one auto is what the other leaves of the world.
  const auto& dp_opt = options_.data_parallel_size.value;
  const auto& tp_opt = options_.tensor_parallel_size.value;
  auto must_divide = [&](int given, const char* name, const char* other) {
    if (world % given != 0) {
      throw InvalidArgumentError(
          "FSDP2Strategy: " + std::string(name) + " " + std::to_string(given) +
          " does not divide the world size " + std::to_string(world) + ", so " +
          other + " \"auto\" has no value; choose a " + name +
          " that divides " + std::to_string(world));
    }
    return world / given;
  };
  int dp = 0, tp = 0;
  if (!dp_opt && !tp_opt) {
    dp = world;
    tp = 1;
  } else if (!dp_opt) {
    tp = *tp_opt;
    dp = must_divide(tp, "tensor_parallel_size", "data_parallel_size");
  } else if (!tp_opt) {
    dp = *dp_opt;
    tp = must_divide(dp, "data_parallel_size", "tensor_parallel_size");
  } else {
    dp = *dp_opt;
    tp = *tp_opt;
  }
  if (dp * tp != world) {
    throw InvalidArgumentError(
        "FSDP2Strategy: data_parallel_size (" + std::to_string(dp) +
        ") x tensor_parallel_size (" + std::to_string(tp) + ") = " +
        std::to_string(dp * tp) + ", but the job has " + std::to_string(world) +
        " ranks; make the product equal the world size or use \"auto\"");
  }
  if (tp > 1 && options_.sharding_strategy == fsdp::ShardingStrategy::kHybridShard) {
    throw InvalidArgumentError(
        "FSDP2Strategy: HYBRID_SHARD with tensor_parallel_size " +
        std::to_string(tp) + " is not supported (its replicate x shard mesh "
        "spans the whole world); use FULL_SHARD, SHARD_GRAD_OP or NO_SHARD "
        "with tensor parallelism, or tensor_parallel_size = 1");
  }
  const bool hybrid = options_.sharding_strategy == fsdp::ShardingStrategy::kHybridShard;
  auto check_shard = [&](int shard) {
    if (dp % shard != 0) {
      throw InvalidArgumentError(
          "FSDP2Strategy: HYBRID_SHARD needs a 2-D (replicate x shard) mesh, "
          "but shard groups of " + std::to_string(shard) +
          " ranks do not divide data_parallel_size " + std::to_string(dp) +
          "; set shard_group_size to a divisor");
    }
    return shard;
  };
  if (hybrid && options_.shard_group_size > 0) check_shard(options_.shard_group_size);
  // The GPU first: NCCL communicators and CUDA work of this process go to
  // the current device.
  device_ = ResolveDevice(options_.device, cluster_.local_rank);
  if (device_.is_cuda()) at::accelerator::setDeviceIndex(device_.index());
  if (options_.gpu_memory_limit_gib > 0) {
    LimitDeviceMemory(device_, options_.gpu_memory_limit_gib, cluster_.rank);
  }
  auto world_ptr = comm::World::Init(cluster_.ToRendezvous(options_.timeout, options_.backend));
  int shard = 0;
  if (hybrid) {
    // By default the ranks of one host, as found at rendezvous: what a
    // launcher exported (LOCAL_WORLD_SIZE and the like) is not trusted.
    shard = check_shard(options_.shard_group_size > 0 ? options_.shard_group_size
                                                      : RanksPerHost(world_ptr->hosts()));
  }
  world_ = std::move(world_ptr);
  WarnIfRankEnvironmentIsMissing(*world_);
  dp_size_ = dp;
  tp_size_ = tp;
  mesh_ = comm::DeviceMesh::Create(world_, {dp, tp}, {"dp", "tp"});
  fsdp_mesh_ = shard > 0 ? comm::DeviceMesh::Create(world_, {dp / shard, shard},
                                                    {"replicate", "shard"})
                         : mesh_;
  torch::manual_seed(options_.seed);
}

void FSDP2Strategy::connect(std::shared_ptr<TrainingModule> module) {
  if (!module || !module->module()) {
    throw InvalidArgumentError("FSDP2Strategy::connect: no module");
  }
  if (parallelized_) {
    throw FailedPreconditionError("FSDP2Strategy::connect: a module is already parallelized");
  }
  module_ = std::move(module);
}

fsdp::DeferredInitGuard FSDP2Strategy::tensor_init_context() const {
  require(/*setup=*/true, /*parallelized=*/false, "tensor_init_context");
  if (parallelized_) {
    throw FailedPreconditionError(
        "FSDP2Strategy::tensor_init_context: the model is already "
        "parallelized; build models under the context before parallelize()");
  }
  return fsdp::DeferredInitGuard();
}

void FSDP2Strategy::parallelize() {
  require(/*setup=*/true, /*parallelized=*/false, "parallelize");
  if (!module_) throw FailedPreconditionError("FSDP2Strategy::parallelize: call connect() first");
  if (parallelized_) {
    std::cerr << "fsdp2: FSDP2Strategy::parallelize() was already applied; "
                 "ignoring this call\n";
    return;
  }
  if (fsdp::DeferredInitGuard::active()) {
    throw FailedPreconditionError(
        "FSDP2Strategy::parallelize: called inside tensor_init_context(); "
        "let the context end (close its scope) first");
  }
  fsdp::FSDPOptions fsdp_options;
  fsdp_options.mesh = fsdp_mesh_;
  fsdp_options.strategy = options_.sharding_strategy;
  fsdp_options.reshard_after_forward = options_.reshard_after_forward;
  fsdp_options.reshard_after_forward_size = options_.reshard_after_forward_size;
  fsdp_options.mp_policy = options_.mp_policy;
  fsdp_options.forward_prefetch = options_.forward_prefetch;
  fsdp_options.offload_policy.cpu_offload = options_.cpu_offload;
  fsdp_options.offload_policy.pin_memory = options_.pin_memory;
  if (options_.cpu_offload && device_.is_cpu() && world_->rank() == 0) {
    std::cerr << "fsdp2: cpu_offload on the CPU: the state already lives in host memory; "
                 "the offload path runs with the CPU standing in for the device and "
                 "changes nothing\n";
  }
  fsdp_options.backward_prefetch = options_.backward_prefetch;
  if (options_.gradient_divide_factor != 0) {
    fsdp_options.gradient_divide_factor = options_.gradient_divide_factor;
  }
  if (fsdp_mesh_ == mesh_) {
    fsdp_options.shard_dim = "dp";
    fsdp_options.replicate_dim = "dp";
  }
  if (device_.is_cpu()) WarnIfLowPrecisionIsSlow(fsdp_options.mp_policy, world_->rank());
  const ParallelizeFn& fn =
      options_.parallelize_fn ? options_.parallelize_fn : DefaultParallelize;
  if (tp_size_ > 1 && fsdp::has_deferred_tensors(*module_->module())) {
    // Materialisation replays each tensor at its full size and keeps FSDP's
    // rows; it does not know tensor-parallel blocks yet.
    throw InvalidArgumentError(
        "FSDP2Strategy::parallelize: a model built under tensor_init_context() "
        "cannot be tensor-parallel yet (tensor_parallel_size " +
        std::to_string(tp_size_) + "); build it eagerly or use "
        "tensor_parallel_size = 1");
  }
  const bool deferred = fsdp::has_deferred_tensors(*module_->module());
  if (!device_.is_cpu()) {
    // Deferred tensors are materialised on the device after sharding.
    if (deferred) {
      MoveRealTensors(*module_->module(), device_);
    } else {
      module_->module()->to(device_);
    }
  }
  std::vector<ParameterInfo> infos;
  std::unordered_set<const c10::TensorImpl*> counted;  // tied parameters once
  int64_t total_param_bytes = 0;
  for (const auto& p : module_->module()->named_parameters(/*recurse=*/true)) {
    infos.push_back({p.key(), p.value().sizes().vec(), p.value().scalar_type()});
    if (counted.insert(p.value().unsafeGetTensorImpl()).second) {
      total_param_bytes += p.value().numel() * static_cast<int64_t>(p.value().element_size());
    }
  }
  ignored_params_ = MatchParameters(*module_->module(), options_.ignored_params, "ignored_params");
  fsdp_options.ignored_params = ignored_params_;
  for (at::Tensor& p : MatchParameters(*module_->module(), options_.frozen_params, "frozen_params")) {
    p.set_requires_grad(false);  // before FSDP, which keeps what it finds
  }
  fn(module_->module(), fsdp_options);
  RequireStillParameters(*module_->module(), ignored_params_, "ignored_params");
  ApplyPrefetchModules(*module_->module(), options_.forward_prefetch_modules,
                       options_.backward_prefetch_modules);
  checkpointed_modules_ = fsdp::apply_activation_checkpointing(
      *module_->module(), options_.activation_checkpointing);
  // Replayed as eager construction draws its numbers; each rank's rows go to the device.
  if (deferred) fsdp::materialize_module(*module_->module(), device_);
  load_hf_weights();
  optimizer_ = module_->configure_optimizers();
  if (!optimizer_) {
    throw InvalidArgumentError("FSDP2Strategy::parallelize: configure_optimizers() returned null");
  }
  if (options_.cpu_offload) {
    host_optimizer_ = std::make_unique<HostOptimizer>(*optimizer_, zero_grad_);
    HostOptimizer* host = host_optimizer_.get();
    fsdp::set_host_gradient_sink(*module_->module(), [host](auto grads) {
      host->receive(std::move(grads));
    });
  }
  parameter_infos_ = std::move(infos);
  total_param_bytes_ = total_param_bytes;
  parallelized_ = true;
  // memory_stats()'s peak starts here: materialising and sharding are set-up.
  fsdp::reset_peak_unsharded_param_bytes();
  ResetPeakDeviceMemory(device_);
}

const std::vector<FSDP2Strategy::ParameterInfo>& FSDP2Strategy::parameter_infos() const {
  require(/*setup=*/false, /*parallelized=*/true, "parameter_infos");
  return parameter_infos_;
}

at::Tensor FSDP2Strategy::apply_loss_reduction(StepType step, const Batch& batch,
                                               at::Tensor output) {
  if (auto reduction = module_->loss_reduction(step)) {
    return reduction->forward(batch, output);
  }
  return output;
}

Batch FSDP2Strategy::to_device(const Batch& batch) const {
  if (device_.is_cpu()) return batch;
  Batch out;
  out.reserve(batch.size());
  for (const auto& t : batch) out.push_back(t.defined() ? t.to(device_) : t);
  return out;
}

at::Tensor FSDP2Strategy::training_step(const Batch& host_batch, int64_t batch_idx) {
  require_optimizer("training_step");
  profiler_.before_step(global_step_, world_->rank(), world_->size());
  const Batch batch = to_device(host_batch);
  if (pending_optimizer_state_) {
    // Deferred restoration: the optimizer has state only now.
    torch::serialize::InputArchive archive;
    std::istringstream in(*pending_optimizer_state_);
    archive.load_from(in);
    optimizer_->load(archive);
    pending_optimizer_state_.reset();
  }
  at::Tensor loss = apply_loss_reduction(
      StepType::kTraining, batch, module_->training_step(batch, batch_idx));
  if (!loss.defined() || loss.numel() != 1) {
    throw InvalidArgumentError(
        "FSDP2Strategy::training_step: the step (after its loss reduction) "
        "must give a scalar loss");
  }
  return loss;
}

void FSDP2Strategy::backward(const at::Tensor& loss, bool sync_gradients,
                             std::optional<double> max_grad_norm) {
  require(true, true, "backward");
  const bool sharded = options_.gradient_accumulation == GradientAccumulation::kSharded;
  fsdp::set_requires_gradient_sync(*module_->module(), sharded || sync_gradients);
  fsdp::set_requires_all_reduce(*module_->module(), !sharded || sync_gradients);
  if (host_optimizer_) {
    // Step each unit as its gradients land only when nothing needs them
    // all first (clipping); with clipping, take each unit's share of the
    // norm as its gradients land.
    host_optimizer_->begin_backward(
        sync_gradients && max_grad_norm.has_value() && !(*max_grad_norm > 0),
        /*norm_parts=*/sync_gradients && max_grad_norm.has_value() && *max_grad_norm > 0);
  }
  try {
    loss.backward();
    if (sync_gradients && options_.ignored_params_all_reduce) {
      const double f = options_.gradient_divide_factor;
      AllReduceGradients(ignored_params_, mesh_->group("dp"), f != 0 ? f : dp_size_);
    }
  } catch (...) {
    if (host_optimizer_) {
      host_optimizer_->begin_backward(false);  // step nothing more
      host_optimizer_->drain();
    }
    throw;
  }
  if (host_optimizer_) host_optimizer_->end_backward();
}

double FSDP2Strategy::optimizer_step(double max_grad_norm) {
  require_optimizer("optimizer_step");
  if (host_optimizer_) host_optimizer_->wait();
  double norm = 0.0;
  if (host_optimizer_ && host_optimizer_->take_stepped()) {
    // The backward stepped every unit on the host already (told 0).
    if (max_grad_norm > 0) {
      throw InvalidArgumentError(
          "FSDP2Strategy::optimizer_step: with cpu_offload the optimizer already "
          "stepped during backward(), which was told max_grad_norm 0, so it cannot "
          "clip to " + std::to_string(max_grad_norm) +
          " now; pass backward() the max_grad_norm you give optimizer_step()");
    }
  } else {
    zero_grad_.materialize();  // those zeroed that got no gradient since
    if (max_grad_norm > 0) {
      // With offload, the gradients' shares of the norm the host optimizer
      // took during the backward.
      norm = tp::clip_grad_norm_(*module_->module(), max_grad_norm, /*norm_type=*/2.0,
                                 host_optimizer_ ? &host_optimizer_->norm_parts() : nullptr);
    }
    if (host_optimizer_) host_optimizer_->norm_parts().clear();  // they hold the gradients
    optimizer_->step();
  }
  // A step taken during the backward ends here as one taken now.
  zero_grad_.zero_grad(*optimizer_);
  ++global_step_;
  profiler_.after_step(global_step_);
  return norm;
}

at::Tensor FSDP2Strategy::evaluation_step(StepType step, const Batch& host_batch,
                                          int64_t idx) {
  at::NoGradGuard no_grad;
  const Batch batch = to_device(host_batch);
  at::Tensor output = step == StepType::kValidation
                          ? module_->validation_step(batch, idx)
                          : module_->test_step(batch, idx);
  return reduce(apply_loss_reduction(step, batch, output), /*mean=*/true);
}

at::Tensor FSDP2Strategy::validation_step(const Batch& batch, int64_t batch_idx) {
  require(true, true, "validation_step");
  return evaluation_step(StepType::kValidation, batch, batch_idx);
}

at::Tensor FSDP2Strategy::test_step(const Batch& batch, int64_t batch_idx) {
  require(true, true, "test_step");
  return evaluation_step(StepType::kTest, batch, batch_idx);
}

at::Tensor FSDP2Strategy::predict_step(const Batch& batch, int64_t batch_idx) {
  require(true, true, "predict_step");
  at::NoGradGuard no_grad;
  return module_->predict_step(to_device(batch), batch_idx);
}

DataLoader FSDP2Strategy::process_dataloader(Batch dataset,
                                             int64_t global_batch_size) const {
  require(true, false, "process_dataloader");
  if (dataset.empty()) {
    throw InvalidArgumentError("process_dataloader: the dataset has no tensors");
  }
  for (const auto& t : dataset) {
    if (!t.defined() || t.dim() == 0 || t.size(0) != dataset[0].size(0)) {
      throw InvalidArgumentError(
          "process_dataloader: every dataset tensor needs the same first "
          "dimension (the rows)");
    }
  }
  DistributedSamplerOptions options = options_.data_sampler;
  options.global_batch_size = global_batch_size;
  DistributedSampler sampler(dataset[0].size(0), data_parallel_rank(), dp_size_,
                             options);
  return DataLoader(std::move(dataset), std::move(sampler));
}

void FSDP2Strategy::teardown() {
  profiler_.finish();
  wait_for_checkpoint();
  if (host_optimizer_) {
    host_optimizer_->drain();
    fsdp::set_host_gradient_sink(*module_->module(), nullptr);
    host_optimizer_.reset();
  }
  optimizer_.reset();
  pending_optimizer_state_.reset();
}

int FSDP2Strategy::data_parallel_rank() const {
  require(true, false, "data_parallel_rank");
  return mesh_->local_rank("dp");
}

torch::optim::Optimizer& FSDP2Strategy::optimizer() {
  require_optimizer("optimizer");
  wait_for_host_optimizer();  // the worker's until its work is done
  return *optimizer_;
}

TrainingModule& FSDP2Strategy::module() {
  if (!module_) throw FailedPreconditionError("FSDP2Strategy::module: call connect() first");
  return *module_;
}

}  // namespace strategy
}  // namespace fsdp2
