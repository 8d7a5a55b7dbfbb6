// fsdp2/core/strategy/fsdp2_strategy.h
//
// FSDP2Strategy: the user-facing strategy, after NeMo/Lightning's
// FSDP2Strategy. Its life:
//
//   FSDP2Strategy strategy(options);
//   strategy.setup_environment();        // cluster env, process groups, mesh,
//                                        // same seed on every rank
//   auto module = std::make_shared<MyModule>(...);  // built after seeding
//   strategy.connect(module);
//   strategy.parallelize();              // parallelize_fn once; optimizer
//   auto loader = strategy.process_dataloader(dataset, global_batch_size);
//   for (int64_t i = 0; i < loader.num_batches(); ++i) {
//     at::Tensor loss = strategy.training_step(loader.batch(i), i);
//     strategy.backward(loss);
//     strategy.optimizer_step(/*max_grad_norm=*/1.0);
//   }
//   strategy.teardown();
//
// Every method that communicates is collective over all ranks. Errors are
// fsdp2::Error (core/common/error.h): InvalidArgumentError (bad options,
// with what to change, a std::invalid_argument), FailedPreconditionError
// (calls in the wrong order, a std::logic_error), IoError (checkpoints) and
// the communication errors of core/comm.
#ifndef FSDP2_CORE_STRATEGY_FSDP2_STRATEGY_H_
#define FSDP2_CORE_STRATEGY_FSDP2_STRATEGY_H_

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/checkpoint/background_saver.h"
#include "core/comm/backend.h"
#include "core/comm/device_mesh.h"
#include "core/comm/world.h"
#include "core/fsdp/deferred_init.h"
#include "core/fsdp/fully_shard.h"
#include "core/strategy/device.h"
#include "core/strategy/option_enums.h"
#include "core/strategy/cluster_environment.h"
#include "core/strategy/distributed_sampler.h"
#include "core/strategy/host_optimizer.h"
#include "core/strategy/lazy_zero_grad.h"
#include "core/strategy/memory_stats.h"
#include "core/strategy/step_profiler.h"
#include "core/strategy/training_module.h"

namespace fsdp2 {
namespace strategy {

// "auto" or a positive number.
struct ParallelSize {
  c10::optional<int> value;  // nullopt: auto
  // "auto": the strategy derives the size in setup_environment().
  static ParallelSize Auto() { return {}; }
  // Exactly `n` ranks; FSDP2Strategy's constructor refuses n < 1
  // (InvalidArgumentError).
  static ParallelSize Of(int n) { return {n}; }
  // "auto" or an integer; throws std::invalid_argument otherwise.
  static ParallelSize Parse(const std::string& text);
  // "auto" or the number, as Parse reads it.
  std::string ToString() const;
};

// Applies tensor parallelism and FSDP to the model. Called once by
// parallelize() with the options the strategy derived: options.mesh is the
// (dp, tp) mesh with shard_dim "dp" (or, for HYBRID_SHARD, a (replicate,
// shard) mesh of the data-parallel ranks), so a parallelize_fn reaches the
// tensor-parallel group as options.mesh->group("tp") when it has that dim.
using ParallelizeFn = std::function<void(
    const std::shared_ptr<torch::nn::Module>& model,
    const fsdp::FSDPOptions& options)>;

// The reference fsdp2_strategy_parallelize. When the mesh has a "tp" dim of
// size > 1, first tp::parallelize_module over it with the model's own plan
// (the model must implement tp::TensorParallelPlanProvider, as GPT does;
// std::invalid_argument otherwise). Then FSDP: the modules the model names
// when it implements fsdp::UnitPlanProvider (unit_plan.h: TorchScript models
// do), otherwise every child of every ModuleList in the model (transformer
// blocks), each become a unit of their own, then the root.
void DefaultParallelize(const std::shared_ptr<torch::nn::Module>& model,
                        const fsdp::FSDPOptions& options);

// The default mixed-precision policy: bf16 parameters and compute, fp32
// gradient reduction, fp32 outputs.
fsdp::MixedPrecisionPolicy DefaultMixedPrecision();

// How an FSDP2Strategy builds its mesh, shards, communicates, checkpoints
// and seeds; each field's default below. The constructor and
// setup_environment() / parallelize() validate them (see each field).
struct FSDP2StrategyOptions {
  // The (dp, tp) device mesh: data_parallel_size x tensor_parallel_size
  // must equal the world size; ranks are laid out row-major, so the
  // tensor-parallel ranks of one group are neighbours (one node). "auto":
  //  - both auto: dp = world size, tp = 1. This is where fsdp2 departs from
  //    NeMo, whose auto is dp = number of nodes, tp = processes per node
  //    (one node: dp = 1, tp = world). Tensor parallelism needs a model
  //    plan (tp::TensorParallelPlanProvider) and costs two all-reduces of
  //    activations per block, which on CPU/Gloo outweighs what it saves, so
  //    fsdp2 keeps plain FSDP data parallelism unless asked: for NeMo's
  //    layout set tensor_parallel_size to the processes per node.
  //  - one auto: it is world size / the other (which must divide it).
  // A tensor_parallel_size > 1 needs tensor-parallel layers (the default
  // parallelize_fn takes the model's plan) and, with HYBRID_SHARD, is
  // refused. Bad combinations throw std::invalid_argument from
  // setup_environment() (sizes) or parallelize() (the model's split) with
  // what to change.
  ParallelSize data_parallel_size;
  ParallelSize tensor_parallel_size;  // the tp dim, as above; default auto
  // Shuffling, seed and drop-last of process_dataloader()'s sampler.
  DistributedSamplerOptions data_sampler;
  // Dtypes of compute, reduction and outputs; default DefaultMixedPrecision()
  // (bf16 compute), an empty policy for fp32 throughout.
  fsdp::MixedPrecisionPolicy mp_policy = DefaultMixedPrecision();
  // What FSDP shards (fsdp::ShardingStrategy); default full shard.
  fsdp::ShardingStrategy sharding_strategy = fsdp::ShardingStrategy::kFullShard;
  // Free gathered parameters after forward; nullopt (default): the sharding
  // strategy's choice (fsdp::FSDPOptions::reshard_after_forward).
  c10::optional<bool> reshard_after_forward;
  // 0, or reshard only down to groups of this many consecutive data-parallel
  // ranks (the ranks of a host), so backward all-gathers stay inside them:
  // fsdp::FSDPOptions::reshard_after_forward_size.
  int reshard_after_forward_size = 0;
  // Sets both from one integer, as the main job's --reshard-after-forward
  // and the C ABI take it: -1 the strategy's default, 0 no, 1 yes, k >= 2
  // reshard_after_forward_size = k. Below -1: InvalidArgumentError (a
  // std::invalid_argument), from the option table's check.
  void set_reshard_after_forward(int value);
  // HYBRID_SHARD: ranks per shard group; the data-parallel ranks form a
  // (replicate x shard) mesh. 0: the ranks of one host, as the ranks tell
  // each other at rendezvous (host name and boot id), under any launcher;
  // every host must then run as many ranks, numbered consecutively
  // (RanksPerHost in cluster_environment.h).
  int shard_group_size = 0;
  // CPU offload (Lightning's "fsdp_cpu_offload", PyTorch's
  // CPUOffloadPolicy): each rank's sharded parameters, their gradients and
  // the optimizer's state live in host memory, and the optimizer steps there
  // (fsdp::OffloadPolicy says what moves when; core/strategy/host_optimizer.h
  // how the steps overlap backward). On a GPU the device then holds only
  // the unsharded parameters of the units in flight, the activations and
  // the reduction buffers. On the CPU it changes nothing but a note in the
  // log: the CPU stands in for the device and training is bit-identical.
  // Default false.
  bool cpu_offload = false;
  // With cpu_offload: host buffers in page-locked memory, so that copies to
  // and from the GPU run asynchronously; default true.
  bool pin_memory = true;
  // Caps this process's GPU memory at this many GiB (the caching
  // allocator's per-process fraction, PyTorch's
  // set_per_process_memory_fraction): a smaller GPU, emulated. A step that
  // does not fit fails with LibTorch's out-of-memory error (the C ABI's
  // FSDP2_ERROR_OUT_OF_MEMORY). 0 (default): the whole GPU. Ignored, with a
  // note, on the CPU. Negative: InvalidArgumentError from the constructor;
  // more than the GPU has: InvalidArgumentError from setup_environment().
  double gpu_memory_limit_gib = 0;
  // Where this rank trains: auto (its GPU when CUDA devices are visible,
  // else the CPU), cpu, cuda (GPU local_rank modulo the visible GPUs:
  // ranks beyond the GPUs share them), or cuda:K (DeviceSpec::Cuda(K)).
  // setup_environment() makes that GPU the process's current device;
  // parallelize() moves the model there before sharding it, and the steps
  // copy each batch there. setup_environment() throws
  // InvalidArgumentError for cuda where no GPU is visible.
  DeviceSpec device;
  // kGloo (host transports; device tensors are staged through host
  // memory) or kNccl (CUDA builds; one GPU per rank).
  comm::Backend backend = comm::Backend::kGloo;
  // How long rendezvous and each collective wait for the other ranks before
  // failing; must be positive (InvalidArgumentError). Default 5 minutes.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // save_checkpoint's format (see CheckpointFormat and
  // core/checkpoint/checkpoint_dir.h); default sharded.
  CheckpointFormat checkpoint_format = CheckpointFormat::kSharded;
  uint64_t seed = 0;  // torch::manual_seed on every rank in setup_environment
  ParallelizeFn parallelize_fn;  // empty: DefaultParallelize
  // Activation checkpointing, applied by parallelize() after parallelize_fn
  // (fsdp::apply_activation_checkpointing): "full" recomputes every unit
  // that contains no other unit (the transformer blocks; a model sharded as
  // one unit, such as a TorchScript model, as a whole), "selective" every
  // k-th of them. Tensor-parallel blocks are recomputed with their
  // collectives. See core/fsdp/activation_checkpoint.h.
  fsdp::ActivationCheckpointing activation_checkpointing;
  // fully_shard's controls (core/fsdp/fsdp_options.h says what each costs
  // and saves): prefetch depths, forward and backward (0 or more, default
  // 1), and the divisor of reduced gradients (0: the data-parallel size,
  // the mean; 1: the sum). The loss a step reports is the mean over ranks
  // whatever the divisor. Bad values: InvalidArgumentError from the
  // constructor.
  int forward_prefetch = 1;
  int backward_prefetch = 1;  // backward's prefetch depth; default 1
  double gradient_divide_factor = 0;  // 0 (default): the data-parallel size
  // Gradient accumulation (micro-batches that backward() with
  // sync_gradients = false): kLocal keeps each unit's unsharded gradients
  // and communicates nothing until the last micro-batch (fewest bytes,
  // memory of a whole unsharded model's gradients); kSharded
  // reduce-scatters every micro-batch inside the shard group, freeing the
  // unsharded gradients at once, and all-reduces across replicas
  // (HYBRID_SHARD's hosts, NO_SHARD's ranks) only at the last
  // (fsdp::set_requires_all_reduce): memory of one sharded gradient, one
  // reduce-scatter per micro-batch, cross-host bytes as with one
  // micro-batch. Default kLocal.
  GradientAccumulation gradient_accumulation = GradientAccumulation::kLocal;
  // Explicit prefetch lists by module name (as the model's named_modules()
  // names them; "" is the root): {"blocks.0", {"blocks.1", "blocks.2"}}
  // makes blocks.0's forward (backward) all-gather blocks.1 and blocks.2 as
  // well, in place of forward_prefetch (backward_prefetch) for blocks.0
  // (fsdp::set_modules_to_forward_prefetch says what it costs and saves).
  // Applied by parallelize() after parallelize_fn. A name that is not a
  // sharded module, or a listed unit that the pass reaches before the
  // unit: std::invalid_argument from parallelize().
  std::map<std::string, std::vector<std::string>> forward_prefetch_modules;
  // Backward's lists, as above (fsdp::set_modules_to_backward_prefetch);
  // default none.
  std::map<std::string, std::vector<std::string>> backward_prefetch_modules;
  // Parameters kept out of FSDP (fsdp::FSDPOptions::ignored_params), by
  // name as the model's named_parameters() names them or by glob patterns
  // over those names ("lm_head.*", "*.bias": fnmatch's *, ? and [...]; *
  // matches dots too). Each stays whole on every rank (its full size in
  // memory per rank, none of its all-gathers or reductions), never sharded,
  // gathered or reduced by FSDP. Under mp_policy (the default bf16 one
  // too) each is cast with its unit: the unit's forward and backward see a
  // param_dtype copy, while its value, gradient and optimizer state stay
  // in its own dtype (fsdp::FSDPOptions::ignored_params). Their gradients are
  // the caller's (ignored_params_all_reduce false, PyTorch's behaviour:
  // each rank keeps its own, and the ranks' copies drift apart unless the
  // caller reduces them) or all-reduced by backward() over the
  // data-parallel ranks once gradients sync (true: divided as FSDP's are,
  // by gradient_divide_factor or the data-parallel size, so training
  // equals one process; one all-reduce per parameter). A pattern that
  // matches no parameter: std::invalid_argument from parallelize().
  std::vector<std::string> ignored_params;
  // Whether backward() all-reduces the ignored parameters' gradients (see
  // above); default false, PyTorch's behaviour.
  bool ignored_params_all_reduce = false;
  // Parameters to train not at all (fine-tuning part of a model), by name
  // or glob pattern as for ignored_params. parallelize() sets them
  // requires_grad(false) before sharding: they get no gradient, no
  // gradient memory, no reduction (a unit whose parameters are all frozen
  // issues no reduce-scatter, on every rank alike) and no optimizer state;
  // they are still sharded, gathered and saved. A pattern that matches no
  // parameter: std::invalid_argument from parallelize().
  std::vector<std::string> frozen_params;
  // A Chrome / Perfetto trace of this many optimizer steps (0, the default:
  // none), through LibTorch's profiler: CPU ops, each step marked
  // "ProfilerStep#N", and where CUDA is present the CUDA kernels and copies
  // (core/strategy/step_profiler.h). Tracing starts after
  // profile_wait_steps steps (default 1: the first step's one-time costs,
  // allocator growth and library set-up, stay out) and the file is written
  // after the last traced step, or at teardown() if training stops first.
  // Negative counts: InvalidArgumentError from the constructor.
  int64_t profile_steps = 0;
  // Steps run before the trace starts (see profile_steps).
  int64_t profile_wait_steps = 1;
  // Where the trace goes; with more than one rank, rank r writes it with
  // ".rank<r>" before the extension. Open it at ui.perfetto.dev.
  std::string profile_path = "fsdp2_trace.json";
};

// This rank's rows of a dataset held as tensors with a common first dim,
// cut into global batches by a DistributedSampler.
class DataLoader {
 public:
  // Holds `dataset` (whole, on every rank) and reads this rank's rows of each
  // global batch as `sampler` says; process_dataloader() builds one.
  DataLoader(Batch dataset, DistributedSampler sampler);
  // Global batches per epoch.
  int64_t num_batches() const { return sampler_.num_batches(); }
  Batch batch(int64_t index) const;  // this rank's rows of global batch
  // Reshuffles for `epoch` (the order depends only on the seed and epoch).
  void set_epoch(int64_t epoch) { sampler_.set_epoch(epoch); }
  // The sampler that picks this rank's rows (local_batch_size(), epoch()).
  const DistributedSampler& sampler() const { return sampler_; }

 private:
  Batch dataset_;
  DistributedSampler sampler_;
};

// Trains a TrainingModule with FSDP2 on this rank (see the file comment for
// its life). Not copyable; one thread at a time.
class FSDP2Strategy {
 public:
  // Keeps `options` and runs every option's check of the option table
  // (option_table.h: sizes, ranges such as forward_prefetch >= 0 and
  // gpu_memory_limit_gib >= 0, ...): InvalidArgumentError naming the option. What needs
  // the world or the model is checked by setup_environment() and
  // parallelize(). No communication.
  explicit FSDP2Strategy(FSDP2StrategyOptions options = {});
  ~FSDP2Strategy();
  FSDP2Strategy(const FSDP2Strategy&) = delete;
  FSDP2Strategy& operator=(const FSDP2Strategy&) = delete;

  // Reads the cluster environment, joins the process group, builds the
  // (dp, tp) device mesh and seeds every rank alike.
  void setup_environment();
  // Attaches the module to train (the strategy shares ownership). Before
  // parallelize(); a later call replaces the module. InvalidArgumentError
  // for a null module or one without a model, FailedPreconditionError once
  // parallelized.
  void connect(std::shared_ptr<TrainingModule> module);
  // Lightning's tensor_init_context(): while the returned guard lives,
  // tensors this thread creates are deferred (meta tensors, no memory; see
  // core/fsdp/deferred_init.h), so a model larger than one rank's memory can
  // be built:
  //   { auto init = strategy.tensor_init_context();
  //     module = std::make_shared<MyModule>(); }
  //   strategy.connect(module);
  //   strategy.parallelize();  // shards, then allocates this rank's rows
  // The parameters come out bit-identical to an eager build after the same
  // seed; on a GPU they are replayed on the CPU and each rank's rows go to
  // its GPU (no rank holds the whole model on either). Call after
  // setup_environment() (which seeds); throws std::logic_error otherwise or
  // after parallelize().
  fsdp::DeferredInitGuard tensor_init_context() const;
  // Applies parallelize_fn once, materialises deferred parameters and
  // buffers (each rank allocates only its rows of sharded parameters) and
  // builds the optimizer. A second call warns on stderr and does nothing.
  // Throws std::logic_error inside tensor_init_context().
  void parallelize();

  // Runs the module's training step (first applying an optimizer state
  // given to load_optimizer_state_dict) and its training loss reduction.
  // Returns the loss, attached to the graph.
  at::Tensor training_step(const Batch& batch, int64_t batch_idx);
  // Backpropagates `loss`. With sync off (gradient accumulation), gradients
  // accumulate as gradient_accumulation says: locally, without
  // communication, or reduce-scattered with the all-reduce across replicas
  // left for the backward with sync on.
  //
  // With cpu_offload, `max_grad_norm` is what the following
  // optimizer_step() will be given. Told 0 (no clipping) in a backward that
  // syncs, the optimizer steps each unit on the host as soon as its
  // gradients arrive, while the backward of the units before it runs, and
  // optimizer_step() then only waits for those steps. Told a positive norm,
  // or not told, the gradients land on the host during backward and
  // optimizer_step() clips and steps after it. optimizer_step() with a norm
  // other than the one a stepping backward was told: InvalidArgumentError.
  // Without cpu_offload it is ignored. (MicroBatchStep, Trainer and the
  // front ends' training steps tell it.)
  void backward(const at::Tensor& loss, bool sync_gradients = true,
                std::optional<double> max_grad_norm = std::nullopt);
  // Clips gradients to a global norm over all shards and tensor-parallel
  // blocks, replicated parameters counted once (if max_grad_norm > 0), steps the
  // optimizer, zeroes gradients and counts the step. Returns the norm
  // before clipping (0 when not clipping). The gradients are zeroed by
  // freeing them (LazyZeroGrad): .grad is undefined until the next backward,
  // so they do not sit in memory through the next forward, and a parameter
  // that gets no gradient by the next step steps with a zero one, as with
  // in-place zeroing (zero_grad(/*set_to_none=*/false)).
  double optimizer_step(double max_grad_norm = 0);
  // Without gradients; the loss averaged over the data-parallel ranks.
  at::Tensor validation_step(const Batch& batch, int64_t batch_idx);
  // As validation_step, through the module's test_step. Collective; after
  // parallelize() (else FailedPreconditionError).
  at::Tensor test_step(const Batch& batch, int64_t batch_idx);
  // Without gradients; this rank's predictions.
  at::Tensor predict_step(const Batch& batch, int64_t batch_idx);

  // A loader over this data-parallel rank's rows (see DataLoader).
  DataLoader process_dataloader(Batch dataset, int64_t global_batch_size) const;

  // This rank's optimizer state (it holds the state of the local shards),
  // serialized.
  std::string optimizer_state_dict() const;
  // Keeps `state` and applies it at the next training_step, once (the
  // optimizer only has state after parallelize()).
  void load_optimizer_state_dict(std::string state);
  // Whether a state given to load_optimizer_state_dict waits for the next
  // training_step (load_checkpoint and teardown() drop it).
  bool has_pending_optimizer_state() const { return pending_optimizer_state_.has_value(); }

  // Full (unsharded) parameters by name, gathered over data- and
  // tensor-parallel ranks: the names and shapes of the model before
  // parallelize(). Collective; with rank0_only the other ranks get an empty
  // list.
  std::vector<std::pair<std::string, at::Tensor>> lightning_module_state_dict(
      bool rank0_only = false);
  // Shards a full state dict (as lightning_module_state_dict gives it, from
  // any (dp, tp) layout) into the live model: each rank keeps its block.
  void load_model_state_dict(
      const std::vector<std::pair<std::string, at::Tensor>>& state,
      bool strict = true);
  // The same from a safetensors file of full tensors by name: a PyTorch
  // model's state_dict() saved as safetensors, or a full checkpoint (its
  // directory or file; its optimizer entries are skipped). Values are
  // converted to the parameters' dtypes. Throws IoError for an unreadable
  // file, InvalidArgumentError for names or shapes that do not match.
  // A Hugging Face checkpoint (a directory with model.safetensors or
  // model.safetensors.index.json, or the index) loads row by row
  // (checkpoint::LoadHfWeights: each rank reads only its rows; always
  // strict).
  void load_model_state_dict(const std::string& safetensors_path, bool strict = true);
  // Writes the model's parameters to directory `dir` in transformers'
  // layout (checkpoint::SaveHfWeights: shards of at most max_shard_bytes
  // and their index, or one model.safetensors; config.json), in `dtype`
  // or the parameters' own, atomically; `from_pretrained(dir)` loads it.
  // The source's tokenizer files and generation_config.json come along
  // (or one made from config.json). With LoRA adapters only they are written,
  // in PEFT's layout. Not an HfModel: InvalidArgumentError. Collective.
  void save_hf_checkpoint(const std::string& dir, int64_t max_shard_bytes = 5'000'000'000,
                          std::optional<at::ScalarType> dtype = std::nullopt);
  // As save_hf_checkpoint, LoRA adapters merged in (W + alpha / rank * B A).
  void save_hf_merged_checkpoint(const std::string& dir, int64_t max_shard_bytes = 5'000'000'000,
                                 std::optional<at::ScalarType> dtype = std::nullopt);

  // Model, optimizer and step counters, written atomically in
  // options().checkpoint_format (see core/checkpoint/*_checkpoint.h). Every
  // parameter and its optimizer state are stored under their original names
  // and full shapes, whatever the (dp, tp) layout, so a checkpoint loads on
  // any other layout and number of ranks.
  //
  // With `async`, a background save: the collective part (target check,
  // gathers) runs now and copies this rank's tensors to a staging buffer,
  // then a background thread writes the files while training continues,
  // still atomically (DIR.tmp, then a swap). At most one is in flight: the
  // next save, load_checkpoint, remove_checkpoint and teardown wait for it.
  // An error of the background write is thrown by the next of those calls or
  // by wait_for_checkpoint().
  void save_checkpoint(const std::string& path, bool async = false);
  // Waits until this rank's part of a background save is written (rank 0:
  // the checkpoint is complete and in place); rethrows its error.
  void wait_for_checkpoint();
  // Whether this rank is still writing a background save.
  bool checkpoint_in_flight() const;
  // Loads a checkpoint directory of either format (or a single-file full
  // checkpoint of an earlier fsdp2) saved on any number of ranks into the
  // parallelized model and optimizer, and restores the epoch and step
  // counters.
  void load_checkpoint(const std::string& path);
  // Throws IoError, on every rank, unless save_checkpoint(path) can write
  // there: a new (creatable, writable) or empty directory, or one holding an
  // earlier checkpoint. Call before training so that a bad target costs no
  // training (Trainer::fit does for TrainerOptions::checkpoint_dir).
  void check_checkpoint_target(const std::string& path);
  // Deletes a checkpoint this strategy wrote (rank 0, after a barrier);
  // refuses other paths.
  void remove_checkpoint(const std::string& path);

  // Returns once every rank has called it. Collective; after
  // setup_environment() (else FailedPreconditionError).
  void barrier();
  // `tensor` from `src` (a world rank) on every rank, in place.
  void broadcast(at::Tensor& tensor, int src = 0);
  // Sum or mean over the data-parallel ranks, as a new tensor.
  at::Tensor reduce(const at::Tensor& tensor, bool mean = true);
  // Explicit unshard / reshard of one sharded module (an FSDP unit), by
  // its name in the model's named_modules() ("blocks.0"; "" is the root):
  // fsdp::unshard and fsdp::reshard (core/fsdp/fully_shard.h). unshard
  // all-gathers the module's parameters ahead of its forward, e.g. to
  // overlap them with work of the caller's own; with async_op it returns at
  // once, and wait() on the handle (or the module's forward) completes the
  // all-gather. The forward then finds them gathered and reshards after it
  // as the options say. reshard frees the gathered parameters (waiting for
  // an all-gather in flight); nothing when sharded. Collective over the
  // module's shard group: every rank makes the same calls in the same
  // order. After parallelize() (FailedPreconditionError otherwise);
  // InvalidArgumentError naming a module that does not exist or is not
  // sharded.
  fsdp::UnshardHandle unshard(const std::string& module_name, bool async_op = false);
  // Frees the gathered parameters of the sharded module `module_name`, as
  // described above (fsdp::reshard).
  void reshard(const std::string& module_name);

  // Waits for a background save in flight (throwing its error) and drops
  // the optimizer and any optimizer state still pending; the process groups
  // live until the strategy is destroyed.
  void teardown();

  // The progress counters that checkpoints save and restore.
  struct EpochStep {
    int64_t epoch = 0;  // as set_epoch() last set it (0 at first)
    int64_t step = 0;  // optimizer steps taken
  };
  // The counters now (load_checkpoint restores them).
  EpochStep current_epoch_step() const { return {epoch_, global_step_}; }
  // Sets the epoch counter only (no reshuffle: DataLoader::set_epoch does
  // that); not checked, the C ABI refuses negatives.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }

  // A parameter as the model was built, before parallelize() sharded it.
  struct ParameterInfo {
    std::string name;  // as the model's named_parameters() names it
    std::vector<int64_t> shape;  // the global (unsharded) shape
    at::ScalarType dtype;  // the parameter's own dtype (not the compute dtype)
  };
  // What this rank holds now (see StrategyMemoryStats): the sharded
  // engine's bytes, the optimizer's state (0 after teardown()), the model's
  // global size and the process's resident memory. Local, not collective;
  // cheap (reads /proc/self/status once). Throws FailedPreconditionError
  // before parallelize().
  StrategyMemoryStats memory_stats() const;
  // With cpu_offload, what the host optimizer did since parallelize():
  // units handed over and stepped during backward, clipping-norm shares
  // taken during backward and used (host_optimizer.h). Local; waits for the
  // host optimizer's work. All zero without cpu_offload.
  OffloadStats offload_stats() const;
  // Starts a new measurement: peak_unsharded_param_bytes and peak_rss_bytes
  // restart from what is held now. Both peaks are process-wide. Throws
  // IoError (and resets nothing) if the kernel refuses to reset the peak
  // resident memory (ResetPeakResidentBytes).
  void reset_peak_memory_stats();

  // Whether parallelize() has been applied.
  bool parallelized() const { return parallelized_; }
  // Every parameter of the connected model, in named_parameters() order,
  // with its name, shape and dtype from before parallelize(): the names
  // load_model_state_dict and lightning_module_state_dict use. Throws
  // FailedPreconditionError before parallelize().
  const std::vector<ParameterInfo>& parameter_infos() const;
  // The modules parallelize() checkpointed (activation_checkpointing), as
  // the model's named_modules() names them ("" for the root).
  const std::vector<std::string>& checkpointed_modules() const {
    return checkpointed_modules_;
  }

  // The options the strategy was made with.
  const FSDP2StrategyOptions& options() const { return options_; }
  // The device this rank trains on (options().device resolved by
  // setup_environment(); the CPU before it).
  const at::Device& device() const { return device_; }
  // `batch` on device(): the same tensors on the CPU, copies on a GPU.
  Batch to_device(const Batch& batch) const;
  // Who this process is in the job, as setup_environment() read it (the
  // single-process defaults before).
  const ClusterEnvironment& cluster() const { return cluster_; }
  // Every rank's process group; null before setup_environment().
  const std::shared_ptr<comm::World>& world() const { return world_; }
  // The (dp, tp) device mesh; null before setup_environment().
  const std::shared_ptr<comm::DeviceMesh>& mesh() const { return mesh_; }
  // The mesh fully_shard shards over: mesh() itself, or with HYBRID_SHARD
  // (replicate, shard).
  const std::shared_ptr<comm::DeviceMesh>& fsdp_mesh() const { return fsdp_mesh_; }
  // This rank's coordinate on the mesh's "dp" dim. After setup_environment()
  // (else FailedPreconditionError).
  int data_parallel_rank() const;
  // The resolved data-parallel size; 0 before setup_environment().
  int data_parallel_size() const { return dp_size_; }
  // The resolved tensor-parallel size; 0 before setup_environment().
  int tensor_parallel_size() const { return tp_size_; }
  // The optimizer over the local shards. FailedPreconditionError before
  // parallelize() or after teardown().
  torch::optim::Optimizer& optimizer();
  // The connected module; FailedPreconditionError before connect().
  TrainingModule& module();

 private:
  void require(bool setup, bool parallelized, const char* what) const;
  void save_hf(const std::string& dir, int64_t max_shard_bytes,
               std::optional<at::ScalarType> dtype, bool merged);
  // As require(true, true, what), and the optimizer is still there (no
  // teardown() since).
  void require_optimizer(const char* what) const;
  // With cpu_offload: waits until the host optimizer's work queued by a
  // backward is done (its error stays for optimizer_step()), so that the
  // shards, .grad and optimizer state can be read.
  void wait_for_host_optimizer() const;
  // parallelize(): loads an HfModel's checkpoint into the sharded model.
  void load_hf_weights();
  at::Tensor apply_loss_reduction(StepType step, const Batch& batch,
                                  at::Tensor output);
  at::Tensor evaluation_step(StepType step, const Batch& batch, int64_t idx);

  FSDP2StrategyOptions options_;
  ClusterEnvironment cluster_;
  std::shared_ptr<comm::World> world_;
  std::shared_ptr<comm::DeviceMesh> mesh_;     // (dp, tp)
  std::shared_ptr<comm::DeviceMesh> fsdp_mesh_;  // what fully_shard uses
  at::Device device_{at::kCPU};
  int dp_size_ = 0;
  int tp_size_ = 0;
  std::shared_ptr<TrainingModule> module_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LazyZeroGrad zero_grad_;
  // cpu_offload: the optimizer's steps on the host (after optimizer_ and
  // zero_grad_, which it uses: destroyed before them).
  std::unique_ptr<HostOptimizer> host_optimizer_;
  std::unique_ptr<checkpoint::BackgroundSaver> saver_;  // background saves
  bool parallelized_ = false;
  std::vector<ParameterInfo> parameter_infos_;
  int64_t total_param_bytes_ = 0;  // the model's parameters before parallelize()
  std::vector<std::string> checkpointed_modules_;
  std::vector<at::Tensor> ignored_params_;  // options_.ignored_params' tensors
  c10::optional<std::string> pending_optimizer_state_;
  int64_t epoch_ = 0;
  int64_t global_step_ = 0;
  StepProfiler profiler_;  // options_.profile_steps
};

}  // namespace strategy
}  // namespace fsdp2

#endif  // FSDP2_CORE_STRATEGY_FSDP2_STRATEGY_H_
