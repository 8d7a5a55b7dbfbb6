// fsdp2/core/fsdp/deferred_init.h
//
// Deferred initialisation: build a model larger than one rank's memory.
//
//   {
//     fsdp::DeferredInitGuard deferred;        // or strategy.tensor_init_context()
//     model = std::make_shared<GPT>(config);   // parameters on the meta device
//   }
//   ... fully_shard the blocks and the root (parameters stay on meta) ...
//   fsdp::materialize_module(*model);          // each rank allocates its rows
//
// While a guard is alive on a thread, every tensor-creating op without tensor
// inputs (empty, zeros, randn, ...) creates a meta tensor (shape and dtype,
// no memory) and every op that reads or writes such a tensor runs on meta;
// both are appended to one process-wide, ordered op log. Stock torch::nn
// modules therefore construct unchanged. Ops on ordinary tensors run as usual.
//
// materialize_module() replays the log in its recorded order on the real
// device, starting from the default CPU generator's state saved when the
// first guard was entered, so every random draw equals the one eager
// construction would have made: parameters come out bit-identical to an
// eager build with the same seed. A replayed tensor lives from the op that
// creates it to the last op that touches its storage; then each sharded
// parameter keeps only this rank's rows and everything else is freed. Peak
// memory is the largest set of full tensors alive at once in the log (for
// stock modules, built one after another: about one module), plus the shards.
// Afterwards the default generator is where eager construction would have
// left it.
//
// Promises and limits:
//  - Replay is faithful for ops that only depend on their recorded inputs,
//    the default generator and the default dtype. A tensor whose value
//    depends on an op that cannot be replayed faithfully (an explicit
//    generator, an in-place change made outside a guard, a tensor made on the
//    meta device explicitly) is marked; materialising it throws
//    std::runtime_error naming the parameter and the op. Values are never
//    silently wrong.
//  - Random draws from the default generator made between leaving the guard
//    and materialize_module() see the generator as it was when the guard was
//    entered (the deferred draws have not happened yet); materialize_module()
//    then resets the generator and replays, so those draws do not advance
//    it. It warns on stderr when it sees that such draws happened.
//  - One log per process: several guards before one materialisation append
//    to it (refused with std::logic_error if the default generator moved in
//    between). materialize_module() consumes the whole log; recorded tensors
//    that are not parameters or buffers of `root` stay on meta.
//  - Tensors created under the guard that are neither parameters nor buffers
//    (e.g. a mask kept in a plain member) stay on meta.
//  - Outside a guard, ops on deferred tensors are not seen. In-place ops on
//    them are detected (version counters) and refused at materialisation;
//    writes through Tensor::data() made outside a guard are not (inside a
//    guard they are recorded like any other op).
//  - A module that is not sharded and still on meta is not guarded: its
//    forward computes on meta. Materialise (or parallelize()) first.
//  - Tensors other than deferred ones that an op reads are copied into the
//    log by value when the op runs (e.g. copy_ from a loaded tensor).
//  - Until materialised, a sharded module refuses to run: fsdp::forward
//    throws std::logic_error saying what to call.
//
// Thread-safety: the guard is per thread; the log is shared and locked.
// The log and its recording are internal/deferred_log.h; the replay is here.
#ifndef FSDP2_CORE_FSDP_DEFERRED_INIT_H_
#define FSDP2_CORE_FSDP_DEFERRED_INIT_H_

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace fsdp2 {
namespace fsdp {

// RAII: tensors created on this thread while it lives are deferred (see the
// file comment). Nestable; movable so that a factory can return it.
class [[nodiscard]] DeferredInitGuard {
 public:
  // Throws std::logic_error if the log holds ops from an earlier guard and
  // the default generator has moved since (materialise first).
  DeferredInitGuard();
  ~DeferredInitGuard();
  // Takes over `other`'s scope: `other` becomes inert (its destructor ends
  // nothing) and this guard's destruction ends the deferral.
  DeferredInitGuard(DeferredInitGuard&& other) noexcept;
  DeferredInitGuard(const DeferredInitGuard&) = delete;
  DeferredInitGuard& operator=(const DeferredInitGuard&) = delete;
  DeferredInitGuard& operator=(DeferredInitGuard&&) = delete;

  // Whether a guard is alive on this thread.
  static bool active();

 private:
  bool engaged_ = true;
};

// Whether `t` was created under a DeferredInitGuard and not materialised yet.
bool is_deferred(const at::Tensor& t);

// Whether any parameter or buffer under `root` is deferred.
bool has_deferred_tensors(torch::nn::Module& root);

// Replays the op log (see the file comment): every sharded parameter under
// `root` gets this rank's rows, every other deferred parameter and buffer its
// full value, in place (the same tensor objects, so module members, shards
// and any optimizer already built stay valid). Local: no communication; every
// rank replays the same log. Throws std::logic_error inside a guard,
// std::runtime_error for a tensor that cannot be replayed faithfully or a
// meta parameter that was not recorded; nothing is half-materialised on
// a check failure (checks run before the replay).
void materialize_module(torch::nn::Module& root);

// materialize_module(root), with everything it writes placed on `device`
// (a GPU): the log is replayed on the devices its ops asked for (the CPU
// for stock modules), so every value equals an eager build moved to
// `device`; then each shard's rows and each other deferred parameter and
// buffer go to `device`, and the sharded units gather their parameters
// there. Tensors that are not deferred are not moved: move them first (a
// replayed op that reads one must find it where it was recorded). Host
// memory peaks as for materialize_module(root); the device holds only what
// stays.
void materialize_module(torch::nn::Module& root, const at::Device& device);

}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_DEFERRED_INIT_H_
