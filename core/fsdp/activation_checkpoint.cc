#include "core/fsdp/activation_checkpoint.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/fsdp/internal/fsdp_param.h"
#include "core/fsdp/internal/fsdp_unit.h"
#include "core/fsdp/internal/recompute_arena.h"
#include "core/fsdp/internal/unit_registry.h"

namespace fsdp2 {
namespace fsdp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ------------------------------------------------------------- the marks

class CheckpointRegistry {
 public:
  static CheckpointRegistry& Get() {
    static auto* registry = new CheckpointRegistry();  // never destroyed
    return *registry;
  }

  void set(const std::shared_ptr<torch::nn::Module>& module, bool enabled) {
    std::lock_guard<std::mutex> lock(mu_);
    drop_dead();
    if (enabled) {
      marked_[module.get()] = module;
    } else {
      marked_.erase(module.get());
    }
    count_.store(marked_.size(), std::memory_order_relaxed);
  }

  bool contains(const torch::nn::Module* module) {
    if (count_.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = marked_.find(module);
    if (it == marked_.end()) return false;
    auto alive = it->second.lock();
    if (alive && alive.get() == module) return true;
    marked_.erase(it);  // a dead module's mark
    count_.store(marked_.size(), std::memory_order_relaxed);
    return false;
  }

 private:
  void drop_dead() {
    for (auto it = marked_.begin(); it != marked_.end();) {
      it = it->second.expired() ? marked_.erase(it) : std::next(it);
    }
  }

  std::mutex mu_;
  std::unordered_map<const torch::nn::Module*, std::weak_ptr<torch::nn::Module>> marked_;
  std::atomic<size_t> count_{0};
};

// The checkpointed module whose forward or recomputation this thread is in.
thread_local const torch::nn::Module* t_region = nullptr;

class RegionGuard {
 public:
  explicit RegionGuard(const torch::nn::Module* module) : previous_(t_region) {
    t_region = module;
  }
  ~RegionGuard() { t_region = previous_; }

 private:
  const torch::nn::Module* previous_;
};

// ------------------------------------------------------- random generators

// The states of the default generators a region draws from: the CPU's,
// and each accelerator's its tensors live on.
struct RngState {
  std::vector<std::pair<c10::Device, at::Tensor>> states;
};

at::Generator DefaultGenerator(const c10::Device& device) {
  if (device.is_cpu()) return at::detail::getDefaultCPUGenerator();
  return at::globalContext().defaultGenerator(device);
}

// The devices whose generators a region with these tensors draws from: the
// CPU, and every accelerator one of them lives on.
std::vector<c10::Device> RngDevices(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices = {c10::Device(c10::kCPU)};
  for (const auto& t : tensors) {
    if (t.defined() && !t.device().is_cpu() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

RngState CaptureRng(const std::vector<c10::Device>& devices) {
  RngState s;
  for (const auto& device : devices) {
    at::Generator gen = DefaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.states.emplace_back(device, gen.get_state());
  }
  return s;
}

void RestoreRng(const RngState& s) {
  for (const auto& [device, state] : s.states) {
    at::Generator gen = DefaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
}

// Restores the generators to a state on scope exit.
class RngRestorer {
 public:
  explicit RngRestorer(RngState state) : state_(std::move(state)) {}
  ~RngRestorer() { RestoreRng(state_); }

 private:
  RngState state_;
};

// --------------------------------------------------- the autograd function

// What one checkpointed call keeps for its recomputation, besides its
// inputs (saved in the autograd context).
struct Region : torch::CustomClassHolder {
  const torch::nn::Module* module = nullptr;
  std::weak_ptr<FSDPUnit> unit;  // its FSDP unit, if any
  std::string name;
  internal::RunFn run;
  // The tensors the forward reads as parameters (an FSDP unit's unsharded
  // parameters, else the module's own): gradients flow to their edges.
  std::vector<at::Tensor> params;
  std::vector<bool> input_requires_grad;
  std::vector<c10::Device> rng_devices;
  RngState rng;  // as the forward found it
};

// Forward without a graph, backward by recomputation. Inputs are the
// region's tensor inputs, then its parameters (so that the function's
// edges lead into the parameters' gradient nodes: for an FSDP unit, its
// post-backward node).
struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs,
                               at::TensorList params,
                               c10::intrusive_ptr<Region> region) {
    ctx->set_materialize_grads(false);
    std::vector<at::Tensor> all = inputs.vec();
    all.insert(all.end(), params.begin(), params.end());
    region->rng_devices = RngDevices(all);
    region->rng = CaptureRng(region->rng_devices);
    for (const auto& t : inputs) region->input_requires_grad.push_back(t.requires_grad());
    ctx->save_for_backward(inputs.vec());
    variable_list outputs;
    {
      RegionGuard guard(region->module);
      outputs = region->run(inputs.vec());  // grad mode is off here
    }
    ctx->saved_data["region"] = c10::IValue::make_capsule(std::move(region));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto region = c10::static_intrusive_pointer_cast<Region>(
        ctx->saved_data["region"].toCapsule());
    variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    inputs.reserve(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor x = saved[i].detach();
      if (region->input_requires_grad[i]) x.requires_grad_(true);
      inputs.push_back(std::move(x));
    }

    // An FSDP unit's recomputed activations, then its gradients, go into an
    // idle buffer of the engine's pool, which returns whole once the unit's
    // post-backward has copied the gradients out. Only for units: their
    // parameter gradients go to that copy, not into .grad.
    std::shared_ptr<FSDPUnit> unit = region->unit.lock();
    c10::optional<internal::RecomputeArena::Scope> arena;
    if (unit) arena.emplace();

    // Recompute with the generators as the forward found them, then let
    // them continue from where they are now.
    std::vector<at::Tensor> outputs;
    {
      RngRestorer restore(CaptureRng(region->rng_devices));
      RestoreRng(region->rng);
      at::AutoGradMode grad_mode(true);
      RegionGuard guard(region->module);
      outputs = region->run(inputs);
    }
    // The unit's backward comes next: the reductions that are ready start
    // (the next unit's prefetch waits for this unit's post-backward). What
    // that allocates is not for the arena.
    if (unit) {
      internal::RecomputeArena::Outside outside;
      unit->post_recompute();
    }
    if (outputs.size() != grad_outputs.size()) {
      throw InternalError("activation checkpointing: the recomputation of '" +
                          region->name + "' gave " + std::to_string(outputs.size()) +
                          " tensors, its forward " +
                          std::to_string(grad_outputs.size()));
    }

    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() &&
          grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    variable_list wrt;
    std::vector<size_t> slot;  // where each of wrt's gradients goes
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].requires_grad()) {
        wrt.push_back(inputs[i]);
        slot.push_back(i);
      }
    }
    for (size_t k = 0; k < region->params.size(); ++k) {
      wrt.push_back(region->params[k]);
      slot.push_back(inputs.size() + k);
    }
    // One gradient per input and parameter, and none for `region`.
    variable_list result(inputs.size() + region->params.size() + 1);
    if (!roots.empty() && !wrt.empty()) {
      variable_list grads = torch::autograd::grad(roots, wrt, root_grads,
                                                  /*retain_graph=*/false,
                                                  /*create_graph=*/false,
                                                  /*allow_unused=*/true);
      for (size_t k = 0; k < grads.size(); ++k) result[slot[k]] = std::move(grads[k]);
    }
    roots.clear();
    outputs.clear();
    arena.reset();
    // The gradients passed on to the inputs outlive this unit's backward:
    // out of the lent buffer with them.
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (internal::RecomputeArena::Holds(result[i])) result[i] = result[i].clone();
    }
    // So do those of the unit's ignored parameters, which go to their .grad.
    for (size_t k = 0; unit && k < region->params.size(); ++k) {
      at::Tensor& grad = result[inputs.size() + k];
      if (!internal::RecomputeArena::Holds(grad)) continue;
      for (const at::Tensor& t : unit->ignored_params()) {
        if (t.is_same(region->params[k])) {
          grad = grad.clone();
          break;
        }
      }
    }
    return result;
  }
};

// The tensors `module`'s forward reads as parameters and that need
// gradients: an FSDP unit's unsharded parameters, else its registered
// parameters, each replaced by its unit's unsharded tensor where an
// enclosing unit shards it.
std::vector<at::Tensor> RegionParams(FSDPUnit* unit, torch::nn::Module* module) {
  std::vector<at::Tensor> params;
  if (unit != nullptr) {
    for (const FSDPParam& p : unit->param_group().params()) {
      if (p.requires_grad()) params.push_back(p.compute());
    }
    // Its ignored parameters are the module's own: their gradients too.
    for (const at::Tensor& t : unit->ignored_params()) {
      if (t.requires_grad()) params.push_back(t);
    }
    return params;
  }
  std::unordered_map<const c10::TensorImpl*, const FSDPParam*> sharded;
  std::vector<std::shared_ptr<FSDPUnit>> units = UnitRegistry::Get().live_units();
  for (const auto& u : units) {
    for (const FSDPParam& p : u->param_group().params()) {
      sharded[p.shard().unsafeGetTensorImpl()] = &p;
    }
  }
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& t : module->parameters(/*recurse=*/true)) {
    if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
    auto it = sharded.find(t.unsafeGetTensorImpl());
    if (it != sharded.end()) {
      if (it->second->requires_grad()) params.push_back(it->second->compute());
    } else if (t.requires_grad()) {
      params.push_back(t);
    }
  }
  return params;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

// ------------------------------------------------------------------ policy

ActivationCheckpointing ActivationCheckpointing::Parse(const std::string& mode,
                                                       int every) {
  const std::string m = Lower(mode);
  if (m == "none") return None();
  if (m == "full") return Full();
  if (m == "selective") {
    if (every < 1) {
      throw InvalidArgumentError(
          "activation checkpointing: selective needs every >= 1 (checkpoint "
          "every k-th block), got " + std::to_string(every));
    }
    return Selective(every);
  }
  throw InvalidArgumentError("activation checkpointing: unknown mode '" + mode +
                             "'; expected none, full or selective");
}

std::string ActivationCheckpointing::ToString() const {
  switch (mode) {
    case Mode::kNone: return "none";
    case Mode::kFull: return "full";
    case Mode::kSelective: return "selective(every " + std::to_string(every) + ")";
  }
  return "?";
}

void checkpoint_module(const std::shared_ptr<torch::nn::Module>& module, bool enabled) {
  if (!module) throw InvalidArgumentError("checkpoint_module: module is null");
  if (enabled) internal::RecomputeArena::Install();
  CheckpointRegistry::Get().set(module, enabled);
}

bool is_checkpointed(const torch::nn::Module& module) {
  return CheckpointRegistry::Get().contains(&module);
}

std::vector<std::string> apply_activation_checkpointing(
    torch::nn::Module& root, const ActivationCheckpointing& policy) {
  if (!policy.enabled()) return {};
  if (policy.mode == ActivationCheckpointing::Mode::kSelective && policy.every < 1) {
    throw InvalidArgumentError(
        "apply_activation_checkpointing: selective needs every >= 1, got " +
        std::to_string(policy.every));
  }
  std::vector<std::string> names;
  int candidate = 0;
  bool any_unit = false;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    torch::nn::Module& module = *item.value();
    if (!UnitRegistry::Get().find(module)) continue;
    any_unit = true;
    if (UnitsUnder(module).size() != 1) continue;  // holds other units
    ++candidate;
    const int every = policy.mode == ActivationCheckpointing::Mode::kFull ? 1 : policy.every;
    if (candidate % every != 0) continue;
    checkpoint_module(item.value());
    names.push_back(item.key());
  }
  if (!any_unit) {
    throw InvalidArgumentError(
        "apply_activation_checkpointing: no sharded module under '" + root.name() +
        "' (apply fully_shard first, or mark modules with checkpoint_module)");
  }
  return names;
}

// ---------------------------------------------------------------- internal

namespace internal {

bool UseCheckpoint(const torch::nn::Module* module) {
  return module != nullptr && at::GradMode::is_enabled() &&
         CheckpointRegistry::Get().contains(module);
}

std::vector<at::Tensor> CheckpointForward(FSDPUnit* unit, torch::nn::Module* module,
                                          RunFn run, std::vector<at::Tensor> inputs) {
  auto region = c10::make_intrusive<Region>();
  region->module = module;
  if (unit != nullptr) {
    region->unit = unit->weak_from_this();
    unit->defer_backward_prefetch();
  }
  region->name = module->name();
  region->run = std::move(run);
  region->params = RegionParams(unit, module);
  std::vector<at::Tensor> params = region->params;
  return CheckpointFunction::apply(at::TensorList(inputs), at::TensorList(params),
                                   std::move(region));
}

void CheckNotInCheckpointedRegion(const torch::nn::Module* sharded) {
  if (t_region == nullptr) return;
  throw FailedPreconditionError(
      "activation checkpointing: the checkpointed module '" + t_region->name() +
      "' calls the sharded module '" + sharded->name() + "' in its forward; "
      "recomputing it would all-gather that module again. Checkpoint the inner "
      "sharded modules instead (apply_activation_checkpointing picks units that "
      "contain no other unit)");
}

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2
