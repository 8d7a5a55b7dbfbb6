// fsdp2/core/fsdp/fully_shard.h
//
// fully_shard(): FSDP2-style fully sharded data parallelism for LibTorch
// modules.
//
// Usage, bottom-up, then the root; optimizers are created afterwards:
//
//   for (auto& block : *model->blocks) fsdp::fully_shard(block, options);
//   fsdp::fully_shard(model, options);
//   torch::optim::AdamW opt(model->parameters(), ...);  // sees local shards
//   auto logits = fsdp::forward(model, tokens);          // not model->forward
//   loss.backward();                                     // grads reduced
//   opt.step();
//
// What fully_shard does to a module:
//  - Each parameter it owns (those of the module's subtree that no inner
//    sharded module owns) is split along dim 0 into one chunk per rank of the
//    shard group; rank r keeps chunk r (trailing ranks may hold fewer or no
//    rows). The module's registered parameter becomes that local shard, so
//    named_parameters() shows the original names with sharded values and a
//    stock torch::optim optimizer holds sharded state.
//  - The module's own tensor members (e.g. LinearImpl::weight) become compute
//    tensors that hold the full parameter only while it is unsharded.
//
// C++ modules have no forward hooks, so a sharded module must be called
// through fsdp::forward(module, args...): it all-gathers the parameters
// before the module runs, frees them afterwards (reshard_after_forward),
// and arranges for the backward pass to all-gather again, reduce-scatter the
// gradients into the shards' .grad and free the unsharded storage. Modules
// inside a sharded module that are not sharded themselves are called as
// usual. Calling a resharded module directly fails with a shape error.
//
// A module marked with checkpoint_module() (activation_checkpoint.h) is
// recomputed in backward instead of keeping its activations.
//
// Sharded modules that run on only some ranks (an expert that gets no rows
// on a rank, an early exit, a data-dependent branch, an output that reaches
// the loss on some ranks only) train as one process would on the global
// batch: every rank issues the same collectives in the same order, in the
// order of the module tree, whatever it calls; a parameter gets a gradient
// when some rank's loss reached it, and none (.grad as it was) when no
// rank's did. A regular model (every rank calls every sharded module, in
// the order they are registered) pays nothing for this. Where ranks skip
// modules, each skipped module costs its all-gather(s) and a reduction of
// zeros on the ranks that skip it. A sharded module called a second time in
// one forward, or after a module registered after it, all-gathers where it
// is called: every rank must then make that call at the same point.
// Every rank's loss must depend on the root module's output.
//
// Thread-safety: one training thread per process. The backward pass must be
// run with Tensor::backward() / torch::autograd::backward (not
// torch::autograd::grad) and without retain_graph.
#ifndef FSDP2_CORE_FSDP_FULLY_SHARD_H_
#define FSDP2_CORE_FSDP_FULLY_SHARD_H_

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/comm/device_mesh.h"
#include "core/comm/process_group.h"
#include "core/fsdp/activation_checkpoint.h"
#include "core/fsdp/fsdp_options.h"
#include "core/fsdp/mixed_precision.h"
#include "core/fsdp/offload.h"
#include "core/fsdp/stats.h"

namespace fsdp2 {
namespace fsdp {

// The state fully_shard() attaches to a module: an opaque handle here (the
// engine is core/fsdp/internal/, starting at fsdp_unit.h).
class FSDPUnit;

// Shards `module` (see the file comment). Throws std::invalid_argument if the
// module is already sharded, the options do not fit the mesh, its parameters
// are on different devices, or one of its parameters is tied to a parameter
// that another sharded module owns. A module with no parameters of its own is
// allowed and communicates nothing. Deferred parameters (built under a
// DeferredInitGuard, see deferred_init.h) are sharded by shape and stay on
// meta until materialize_module(); std::logic_error inside a guard.
std::shared_ptr<FSDPUnit> fully_shard(
    const std::shared_ptr<torch::nn::Module>& module,
    const FSDPOptions& options);

// The same for a module holder (e.g. a model's TORCH_MODULE type): shards
// the module it holds.
template <typename Impl>
std::shared_ptr<FSDPUnit> fully_shard(
    const torch::nn::ModuleHolder<Impl>& module, const FSDPOptions& options) {
  return fully_shard(std::static_pointer_cast<torch::nn::Module>(module.ptr()),
                     options);
}

// The unit fully_shard made of `module`, or nullptr (also for a module
// built where a sharded module that has since died used to live).
std::shared_ptr<FSDPUnit> unit_of(const torch::nn::Module& module);

// Turns gradient reduction on or off for every sharded module under `root`.
// Off: backward accumulates unsharded gradients locally (no communication);
// the next backward with it on reduces them together with its own.
void set_requires_gradient_sync(torch::nn::Module& root, bool sync);

// For HYBRID_SHARD (and NO_SHARD) under gradient accumulation, with
// gradient sync on: off, each backward reduce-scatters its gradients inside
// the shard group (so the unsharded gradients are freed at once: memory of
// one unit's gradients, not the whole model's) and keeps the result as a
// running sharded sum (memory: one sharded gradient per unit), but does not
// all-reduce across the replicas (the slow links between hosts); the next
// backward with it on all-reduces that sum together with its own, once, and
// writes the shards' .grad. Costs one reduce-scatter per micro-batch inside
// the shard group. Without replicas it changes nothing (every reduction
// writes the shards' .grad). Collective: every rank sets the same.
void set_requires_all_reduce(torch::nn::Module& root, bool all_reduce);

// Sets FSDPOptions::gradient_divide_factor for every sharded module under
// `root` (1: sum). Throws std::invalid_argument unless `factor` > 0.
void set_gradient_divide_factor(torch::nn::Module& root, double factor);

// CPU offload (OffloadPolicy): hands each unit's reduced gradients under
// `root`, copied to host memory, to `sink` (core/fsdp/offload.h) instead of
// adding them to the shards' .grad before the reduction returns; null
// restores that. Units without offload ignore it.
void set_host_gradient_sink(torch::nn::Module& root, HostGradientSink sink);

// An all-gather started by unshard(module, /*async_op=*/true).
class UnshardHandle {
 public:
  UnshardHandle() = default;
  // A handle on `unit`'s all-gather in flight (unshard() makes it); it does
  // not keep the unit alive.
  explicit UnshardHandle(std::weak_ptr<FSDPUnit> unit);
  // Waits for the all-gather; the module's parameters are then whole.
  // Once; later calls (and a handle on a dead module) do nothing.
  void wait();

 private:
  std::weak_ptr<FSDPUnit> unit_;
};

// All-gathers `module`'s parameters ahead of its forward (PyTorch's
// FSDPModule.unshard), e.g. to overlap them with work of your own before
// the model runs: forward then finds them gathered, and reshards after it
// as the options say. async_op: return at once, wait() on the handle
// (forward also waits). Collective over the module's shard group: every
// rank makes the same calls in the same order. Throws
// std::invalid_argument if `module` is not sharded, std::logic_error while
// its parameters are deferred.
UnshardHandle unshard(const torch::nn::Module& module, bool async_op = false);
// Frees `module`'s unsharded parameters (waiting for an all-gather in
// flight); nothing if sharded. Throws std::invalid_argument if `module` is
// not sharded.
void reshard(const torch::nn::Module& module);

// Explicit prefetch lists (PyTorch's FSDPModule.set_modules_to_forward_
// prefetch / set_modules_to_backward_prefetch): when `module`'s forward
// (backward) begins, all-gather `modules` as well, in this order, in place
// of the forward_prefetch (backward_prefetch) depth for `module`; an empty
// list prefetches nothing from it. Each listed unit costs its parameters
// held from `module`'s turn to its own; it saves that unit's exposed
// all-gather wait. The backward lists may run past the depth (no cap).
// Listed modules must be sharded, under the same root as `module`, and
// come after it in the pass (forward: the module tree's pre-order, which
// is the order fsdp runs forward all-gathers in; backward: the reverse,
// children last first): check_prefetch_lists() verifies that, and the
// root's first forward (FSDP2Strategy::parallelize() calls it). Every rank
// must set the same lists. Throws std::invalid_argument if `module` or one
// of `modules` is not sharded, or `modules` lists `module` itself or one
// module twice.
void set_modules_to_forward_prefetch(
    const torch::nn::Module& module,
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules);
// The backward list of `module`, as described above: all-gathered, in this
// order, when `module`'s backward begins.
void set_modules_to_backward_prefetch(
    const torch::nn::Module& module,
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules);
// Throws std::invalid_argument, naming the unit and the module, where a
// prefetch list of a unit under `root` names a module that no longer
// exists, a unit of another root (not under `root`), or one that its pass
// reaches before it.
void check_prefetch_lists(torch::nn::Module& root);

// Parameters whose local tensor is one block of a tensor split over `group`
// (tensor parallelism, see core/tp): clip_grad_norm_ sums their norms over
// `group`. Every other parameter is the same on each rank of `group` and
// counts once.
struct SplitParameters {
  std::shared_ptr<comm::ProcessGroup> group;  // null or size 1: none split
  std::unordered_set<std::string> names;  // as root.named_parameters() names them
};

// Clips the gradients of every parameter under `root` (the local shards'
// .grad) so that their global norm is at most `max_norm`, like
// torch::nn::utils::clip_grad_norm_ on the unsharded model: every element
// of every parameter counts once (tied parameters too), shards summed over
// their shard groups, `split` blocks over split.group, parameters outside
// FSDP as this rank holds them. norm_type may be infinity. Returns the
// global norm before clipping. Collective over the shard groups and
// split.group.
double clip_grad_norm_(torch::nn::Module& root, double max_norm,
                       double norm_type = 2.0,
                       const SplitParameters& split = {});

// Per-rank bytes held by the sharded modules under `root`.
MemoryStats memory_stats(torch::nn::Module& root);
// High-water mark of all-gathered parameter bytes alive at once in this
// process since the last reset.
int64_t peak_unsharded_param_bytes();
// Restarts that high-water mark from the bytes alive now (process-wide).
void reset_peak_unsharded_param_bytes();

// The engine's buffer pool (see BufferPoolStats), and a way to give the
// buffers it keeps for the next step back to the system, e.g. after
// training. Thread-safe.
BufferPoolStats buffer_pool_stats();
// Frees the buffers the pool keeps for reuse (kept_bytes becomes 0); buffers
// in use are not touched and return to the pool when released.
void release_buffer_pool();

// The communication waits of `module`'s unit since its last reset. Throws
// std::invalid_argument if `module` is not sharded.
CommWaitStats comm_wait_stats(const torch::nn::Module& module);
// Resets the waits of every sharded module under `root`.
void reset_comm_wait_stats(torch::nn::Module& root);

// The full (unsharded) value of every parameter under `root`, named as
// root.named_parameters() names them, in the parameters' own dtype (the
// masters under mixed precision), as new tensors. Collective: every rank of
// every shard group under `root` calls it.
std::vector<std::pair<std::string, at::Tensor>> full_state_dict(
    torch::nn::Module& root);

// Copies full values into the sharded parameters under `root`: each rank
// keeps its own rows. Names as in full_state_dict(). Throws
// std::invalid_argument naming the parameter on a missing or unexpected name
// (when `strict`) or a shape mismatch; nothing is modified then.
void load_full_state_dict(
    torch::nn::Module& root,
    const std::vector<std::pair<std::string, at::Tensor>>& state,
    bool strict = true);

// Where each parameter under `root` lives on this rank, for checkpoints.
struct ShardInfo {
  std::string name;            // as root.named_parameters() names it
  at::Tensor shard;            // the optimizer's parameter (local rows)
  std::vector<int64_t> global_shape;  // the unsharded parameter's shape
  int64_t rows = 0;            // global dim-0 size (1 for 0-d parameters)
  int64_t row_start = 0;       // first global row held here
  int64_t local_rows = 0;      // rows held here (0 on ranks past the end)
  // True on exactly one rank per distinct row range: replicas (NO_SHARD,
  // HYBRID_SHARD's other groups, parameters outside FSDP) are not primary.
  bool primary = true;
  // The ranks that hold the other rows (null: this rank holds them all), and
  // the padded rows per rank that an all-gather over that group exchanges.
  std::shared_ptr<comm::ProcessGroup> group;
  int64_t shard_rows = 0;      // padded rows per rank (rows for a replica)
};

// The full value of a tensor shaped like `info.shard` (the shard itself, or
// optimizer state that shards the same way), gathered over info.group.
// Collective over that group.
at::Tensor gather_rows(const ShardInfo& info, const at::Tensor& local);
// One ShardInfo per parameter under `root`, in named_parameters() order.
// `world_rank` decides `primary` for parameters outside FSDP (rank 0's
// copy is primary). Local: no communication.
std::vector<ShardInfo> shard_info(torch::nn::Module& root, int world_rank);

namespace internal {

// Called by forward(); see FSDPUnit.
FSDPUnit* FindUnit(const torch::nn::Module* module);
void PreForward(FSDPUnit* unit);
at::Tensor CastInput(FSDPUnit* unit, const at::Tensor& t);
std::vector<at::Tensor> PostForward(FSDPUnit* unit,
                                    std::vector<at::Tensor> outputs);
void AbortForward(FSDPUnit* unit);

inline torch::nn::Module* ModulePtr(const std::shared_ptr<torch::nn::Module>& m) {
  return m.get();
}
template <typename Impl>
torch::nn::Module* ModulePtr(const std::shared_ptr<Impl>& m) {
  return m.get();
}
template <typename Impl>
torch::nn::Module* ModulePtr(const torch::nn::ModuleHolder<Impl>& m) {
  return m.ptr().get();
}

inline at::Tensor CastArg(FSDPUnit* unit, const at::Tensor& arg) {
  return CastInput(unit, arg);
}
template <typename T, typename = std::enable_if_t<
                          !std::is_same<std::decay_t<T>, at::Tensor>::value>>
T&& CastArg(FSDPUnit*, T&& arg) {
  return std::forward<T>(arg);
}

// Flattens the tensors of a forward's result, and rebuilds it from them.
template <typename T>
struct OutputTensors {
  static_assert(sizeof(T) == 0,
                "fsdp::forward supports modules returning at::Tensor, "
                "std::vector<at::Tensor>, or std::tuple/std::pair of those");
};
template <>
struct OutputTensors<at::Tensor> {
  static void collect(const at::Tensor& t, std::vector<at::Tensor>& out) {
    out.push_back(t);
  }
  static at::Tensor rebuild(const at::Tensor&, std::vector<at::Tensor>& in,
                            size_t& i) {
    return in[i++];
  }
};
template <>
struct OutputTensors<std::vector<at::Tensor>> {
  static void collect(const std::vector<at::Tensor>& v,
                      std::vector<at::Tensor>& out) {
    out.insert(out.end(), v.begin(), v.end());
  }
  static std::vector<at::Tensor> rebuild(const std::vector<at::Tensor>& v,
                                         std::vector<at::Tensor>& in,
                                         size_t& i) {
    std::vector<at::Tensor> r(in.begin() + i, in.begin() + i + v.size());
    i += v.size();
    return r;
  }
};
template <typename... Ts>
struct OutputTensors<std::tuple<Ts...>> {
  static void collect(const std::tuple<Ts...>& t,
                      std::vector<at::Tensor>& out) {
    std::apply([&](const auto&... e) {
      (OutputTensors<std::decay_t<decltype(e)>>::collect(e, out), ...);
    }, t);
  }
  static std::tuple<Ts...> rebuild(const std::tuple<Ts...>& t,
                                   std::vector<at::Tensor>& in, size_t& i) {
    return std::apply([&](const auto&... e) {
      return std::tuple<Ts...>{
          OutputTensors<std::decay_t<decltype(e)>>::rebuild(e, in, i)...};
    }, t);
  }
};
template <typename A, typename B>
struct OutputTensors<std::pair<A, B>> {
  static void collect(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
    OutputTensors<A>::collect(p.first, out);
    OutputTensors<B>::collect(p.second, out);
  }
  static std::pair<A, B> rebuild(const std::pair<A, B>& p,
                                 std::vector<at::Tensor>& in, size_t& i) {
    A a = OutputTensors<A>::rebuild(p.first, in, i);
    B b = OutputTensors<B>::rebuild(p.second, in, i);
    return {std::move(a), std::move(b)};
  }
};

// ---- activation checkpointing (activation_checkpoint.h): a forward's
// arguments kept for its recomputation. Tensors are not kept here (the
// recomputation gets them back as its inputs); other values are copied.
template <typename T>
struct KeptArg {
  static_assert(!std::is_same<T, std::vector<at::Tensor>>::value &&
                    !std::is_same<T, c10::optional<at::Tensor>>::value,
                "a checkpointed module's forward takes tensors as at::Tensor "
                "arguments (gradients flow into those only)");
  explicit KeptArg(const T& v) : value(v) {}
  const T& get(const std::vector<at::Tensor>&, size_t&) const { return value; }
  T value;
};
template <>
struct KeptArg<at::Tensor> {
  explicit KeptArg(const at::Tensor&) {}
  const at::Tensor& get(const std::vector<at::Tensor>& inputs, size_t& next) const {
    return inputs[next++];
  }
};

inline void CollectTensorArg(FSDPUnit* unit, const at::Tensor& t,
                             std::vector<at::Tensor>& out) {
  out.push_back(unit != nullptr ? CastInput(unit, t) : t);
}
template <typename T>
void CollectTensorArg(FSDPUnit*, const T&, std::vector<at::Tensor>&) {}

// module->forward(args...) as a checkpointed region (CheckpointForward).
template <typename M, typename... Args>
auto CheckpointedForward(FSDPUnit* unit, M module, Args&&... args) {
  using Out = decltype(module->forward(std::forward<Args>(args)...));
  std::vector<at::Tensor> inputs;
  (CollectTensorArg(unit, args, inputs), ...);
  using Kept = std::tuple<KeptArg<std::decay_t<Args>>...>;
  auto kept = std::make_shared<Kept>(KeptArg<std::decay_t<Args>>(args)...);
  // The forward's result, to rebuild the output from its tensors; only the
  // first run (the forward, not the recomputation) fills it.
  struct Shape {
    c10::optional<Out> out;
    bool filled = false;
  };
  auto shape = std::make_shared<Shape>();
  RunFn run = [module, kept, shape](const std::vector<at::Tensor>& tensors) mutable {
    size_t next = 0;
    Out out = std::apply(
        [&](const auto&... k) {
          // Braced initialisation takes the tensors in argument order.
          std::tuple<decltype(k.get(tensors, next))...> a{k.get(tensors, next)...};
          return std::apply([&](const auto&... x) { return module->forward(x...); }, a);
        },
        *kept);
    std::vector<at::Tensor> flat;
    OutputTensors<Out>::collect(out, flat);
    if (!shape->filled) {
      shape->filled = true;
      shape->out = std::move(out);
    }
    return flat;
  };
  std::vector<at::Tensor> flat =
      CheckpointForward(unit, ModulePtr(module), std::move(run), std::move(inputs));
  size_t i = 0;
  Out result = OutputTensors<Out>::rebuild(*shape->out, flat, i);
  shape->out.reset();  // it holds the forward's tensors
  return result;
}

}  // namespace internal

// Runs module->forward(args...) under FSDP: unshards before, reshards after
// and hooks the backward pass. A module that is not sharded just runs.
// Tensor arguments are cast to param_dtype when the policy asks for it. A
// module marked with checkpoint_module() runs as a checkpointed region
// (activation_checkpoint.h), sharded or not.
template <typename M, typename... Args>
auto forward(M module, Args&&... args) {
  torch::nn::Module* ptr = internal::ModulePtr(module);
  FSDPUnit* unit = internal::FindUnit(ptr);
  const bool checkpointed = internal::UseCheckpoint(ptr);
  if (unit == nullptr) {
    if (checkpointed) {
      return internal::CheckpointedForward(nullptr, module, std::forward<Args>(args)...);
    }
    return module->forward(std::forward<Args>(args)...);
  }
  internal::PreForward(unit);
  using Out = decltype(module->forward(std::forward<Args>(args)...));
  try {
    Out out = checkpointed
                  ? internal::CheckpointedForward(unit, module, std::forward<Args>(args)...)
                  : module->forward(internal::CastArg(unit, std::forward<Args>(args))...);
    std::vector<at::Tensor> flat;
    internal::OutputTensors<Out>::collect(out, flat);
    flat = internal::PostForward(unit, std::move(flat));
    size_t i = 0;
    return internal::OutputTensors<Out>::rebuild(out, flat, i);
  } catch (...) {
    internal::AbortForward(unit);
    throw;
  }
}

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_FULLY_SHARD_H_
