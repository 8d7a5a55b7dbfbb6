#include "core/fsdp/deferred_init.h"
#include "core/common/error.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <iostream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/fsdp/assign_data.h"
#include "core/fsdp/internal/deferred_log.h"
#include "core/fsdp/internal/fsdp_param.h"
#include "core/fsdp/internal/fsdp_unit.h"
#include "core/fsdp/internal/host_offload.h"
#include "core/fsdp/internal/unit_registry.h"

namespace fsdp2 {
namespace fsdp {
namespace {

using internal::GetLog;
using internal::IdOf;
using internal::Log;
using internal::OpRecord;
using internal::TensorRecord;

thread_local int t_guard_depth = 0;  // guards alive on this thread

}  // namespace

DeferredInitGuard::DeferredInitGuard() {
  if (t_guard_depth == 0) {
    Log& log = GetLog();
    std::lock_guard<std::mutex> lock(log.mu);
    internal::ConfirmSetData(log);
    at::Tensor state = internal::GeneratorState();
    if (log.ops.empty()) {
      log.generator_state = state;
    } else if (!at::equal(state, log.generator_state)) {
      throw FailedPreconditionError(
          "tensor_init_context(): the default generator has drawn numbers "
          "since an earlier context whose tensors are not materialised yet; "
          "their replay would no longer match eager construction. "
          "Materialise (parallelize()) before drawing, or build everything "
          "in one context");
    }
    c10::impl::tls_set_dispatch_key_included(internal::kDeferredInitKey, true);
  }
  ++t_guard_depth;
}

DeferredInitGuard::DeferredInitGuard(DeferredInitGuard&& other) noexcept {
  other.engaged_ = false;
}

DeferredInitGuard::~DeferredInitGuard() {
  if (!engaged_) return;
  if (--t_guard_depth == 0) {
    c10::impl::tls_set_dispatch_key_included(internal::kDeferredInitKey, false);
    Log& log = GetLog();
    std::lock_guard<std::mutex> lock(log.mu);
    internal::ConfirmSetData(log);  // a set_data that was the context's last act
  }
}

bool DeferredInitGuard::active() { return t_guard_depth > 0; }

bool is_deferred(const at::Tensor& t) {
  if (!t.defined() || !t.is_meta()) return false;
  Log& log = GetLog();
  std::lock_guard<std::mutex> lock(log.mu);
  return IdOf(log, t) >= 0;
}

bool has_deferred_tensors(torch::nn::Module& root) {
  for (const auto& p : root.parameters(/*recurse=*/true)) {
    if (p.defined() && p.is_meta()) return true;
  }
  for (const auto& b : root.buffers(/*recurse=*/true)) {
    if (b.defined() && b.is_meta()) return true;
  }
  return false;
}

namespace {

// Throws std::runtime_error unless recorded tensor `id` can be replayed into
// `name`: recorded, untainted, and unchanged since (shape, dtype, version
// and, when `check_storage`, storage).
void CheckReplayable(const Log& log, const std::string& name, int64_t id,
                     const std::vector<int64_t>& shape, at::ScalarType dtype,
                     bool check_storage) {
  if (id < 0) {
    throw std::runtime_error(
        "materialize_module: '" + name + "' is on the meta device but was not "
        "created under tensor_init_context() (or its op log was already "
        "replayed by an earlier materialisation); build the model inside "
        "one context and parallelize it once");
  }
  const TensorRecord& r = log.tensors[id];
  if (!r.taint.empty()) {
    throw std::runtime_error("materialize_module: cannot materialise '" + name +
                             "' faithfully: " + r.taint);
  }
  const bool changed = r.version != r.impl->version_counter().current_version() ||
                       (check_storage && !r.storage.is_alias_of(r.impl->storage()));
  if (changed || r.sizes != shape || r.dtype != dtype) {
    throw std::runtime_error(
        "materialize_module: '" + name + "' was changed outside "
        "tensor_init_context() after it was created (an in-place op, "
        "Module::to or set_data after the context ended): replay would "
        "not reproduce it. Make such changes inside the context");
  }
}

// Where a replayed tensor's value goes: a shard's rows or a whole tensor.
struct Target {
  std::string name;
  at::Tensor tensor;                // keeps its identity, gets the data
  const FSDPParam* param = nullptr;  // null: the full value
};

// Per recorded tensor id, where its value goes.
using Targets = std::unordered_map<int64_t, std::vector<Target>>;

// Where each recorded tensor's value goes: the shards of `units` get their
// rows, every other meta parameter and buffer of `root` its full value.
// Everything is checked before anything is replayed.
Targets CollectTargets(const Log& log, torch::nn::Module& root,
                       const std::vector<FSDPUnit*>& units) {
  Targets targets;
  std::unordered_set<const c10::TensorImpl*> handled;
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  for (FSDPUnit* unit : units) {
    for (const FSDPParam& p : unit->param_group().params()) {
      if (!p.shard().is_meta()) continue;
      auto it = names.find(p.shard().unsafeGetTensorImpl());
      const std::string name = it != names.end() ? it->second : p.name();
      const int64_t id = IdOf(log, p.compute());
      CheckReplayable(log, name, id, p.global_shape(), p.shard().scalar_type(),
                      /*check_storage=*/false);
      targets[id].push_back({name, p.shard(), &p});
      handled.insert(p.shard().unsafeGetTensorImpl());
    }
  }
  auto add_full = [&](const std::string& name, const at::Tensor& t) {
    if (!t.defined() || !t.is_meta() || !handled.insert(t.unsafeGetTensorImpl()).second) {
      return;
    }
    const int64_t id = IdOf(log, t);
    CheckReplayable(log, name, id, t.sizes().vec(), t.scalar_type(),
                    /*check_storage=*/true);
    targets[id].push_back({name, t, nullptr});
  };
  for (const auto& item : root.named_parameters(/*recurse=*/true)) add_full(item.key(), item.value());
  for (const auto& item : root.named_buffers(/*recurse=*/true)) add_full(item.key(), item.value());
  return targets;
}

// Per op, the targets to write and the tensors to release after it.
struct Lifetimes {
  std::vector<std::vector<int64_t>> write_after, release_after;
};

// A tensor lives from its first op to its last; a target until the last op
// that touches its final storage (an in-place op through a view).
Lifetimes PlanLifetimes(const Log& log, const Targets& targets) {
  const size_t num_ops = log.ops.size();
  std::vector<int64_t> last_ref(log.tensors.size(), -1);
  std::unordered_map<const c10::StorageImpl*, int64_t> last_touch;
  for (size_t i = 0; i < num_ops; ++i) {
    for (const auto& [id, storage] : log.ops[i].touched) {
      last_ref[id] = static_cast<int64_t>(i);
      last_touch[storage.unsafeGetStorageImpl()] = static_cast<int64_t>(i);
    }
  }
  Lifetimes out{std::vector<std::vector<int64_t>>(num_ops),
                std::vector<std::vector<int64_t>>(num_ops)};
  for (size_t id = 0; id < log.tensors.size(); ++id) {
    int64_t end = last_ref[id];
    if (targets.count(id)) {
      end = std::max(end, last_touch[log.tensors[id].storage.unsafeGetStorageImpl()]);
      out.write_after.at(end).push_back(static_cast<int64_t>(id));
    }
    if (end >= 0) out.release_after[end].push_back(static_cast<int64_t>(id));
  }
  return out;
}

// Gives `target` its value from the replayed `full` tensor, on `device`
// (nullopt: where the replay made it).
void WriteTarget(const Target& target, const at::Tensor& full,
                 const std::optional<at::Device>& device) {
  const at::Device to = device.value_or(full.device());
  if (target.param != nullptr) {
    const at::Tensor rows = target.param->local_rows_of(full);
    // The shard's own place: `to`, or host memory with CPU offload (never
    // the device, then).
    at::Tensor shard;
    const at::TensorOptions where = target.param->shard_options(to).dtype(rows.scalar_type());
    if (where.device().is_cpu()) {
      shard = internal::EmptyHost(target.tensor.sizes(), where);
      shard.view(rows.sizes()).copy_(rows);
    } else {
      shard = rows.to(to, rows.scalar_type(), /*non_blocking=*/false,
                      /*copy=*/true, at::MemoryFormat::Contiguous)
                  .view(target.tensor.sizes());
    }
    assign_data(target.tensor, shard);
  } else if (to != full.device()) {
    assign_data(target.tensor, full.to(to, full.scalar_type(), /*non_blocking=*/false,
                                       /*copy=*/true, at::MemoryFormat::Contiguous));
  } else {
    const bool owns_storage = full.storage_offset() == 0 &&
                              full.is_contiguous() &&
                              full.storage().nbytes() == full.nbytes();
    assign_data(target.tensor, owns_storage ? full : full.clone());
  }
}

// Runs the log's ops in order on real tensors from the generator state the
// log started with, writing every target when its value is final.
void Replay(Log& log, Targets& targets, const std::optional<at::Device>& device) {
  const Lifetimes lifetimes = PlanLifetimes(log, targets);
  at::Tensor state_now = internal::GeneratorState();
  if (!at::equal(state_now, log.generator_state)) {
    std::cerr << "fsdp2: warning: the default generator drew numbers between "
                 "tensor_init_context() and materialisation; those draws "
                 "repeated the deferred initialisation's first numbers and "
                 "no longer count: the generator is now where eager "
                 "construction would have left it\n";
  }
  at::NoGradGuard no_grad;
  const caffe2::TypeMeta default_dtype = at::get_default_dtype();
  internal::SetGeneratorState(log.generator_state);
  std::vector<at::Tensor> real(log.tensors.size());
  auto lookup = [&](const at::Tensor& t) -> at::Tensor {
    const int64_t id = IdOf(log, t);
    if (id < 0) return t;
    TORCH_INTERNAL_ASSERT(real[id].defined(), "deferred init replay: tensor ", id,
                          " used before it was created or after release");
    return real[id];
  };
  try {
    for (size_t i = 0; i < log.ops.size(); ++i) {
      OpRecord& rec = log.ops[i];
      if (rec.kind == OpRecord::kSetData) {
        real[rec.self].set_data(real[rec.from]);
      } else if (rec.kind == OpRecord::kAlias) {
        const at::Tensor& from = real[rec.from];
        real[rec.self] = at::empty({0}, from.options())
                             .set_(from.storage(), rec.alias_offset,
                                   rec.alias_sizes, rec.alias_strides);
      } else {
        if (at::get_default_dtype() != rec.default_dtype) {
          at::set_default_dtype(rec.default_dtype);
        }
        torch::jit::Stack stack;
        for (const auto& arg : rec.args) stack.push_back(internal::MapTensors(arg, lookup));
        rec.op->callBoxed(&stack);
        size_t k = 0;
        for (const auto& v : stack) {
          internal::ForEachTensor(v, [&](const at::Tensor& t) {
            const int64_t id = k < rec.outputs.size() ? rec.outputs[k] : -1;
            ++k;
            if (id >= 0) real[id] = t;
          });
        }
      }
      for (int64_t id : lifetimes.write_after[i]) {
        for (const Target& target : targets[id]) WriteTarget(target, real[id], device);
      }
      for (int64_t id : lifetimes.release_after[i]) real[id] = at::Tensor();
    }
  } catch (...) {
    at::set_default_dtype(default_dtype);
    throw;
  }
  at::set_default_dtype(default_dtype);
}

}  // namespace

namespace {

void Materialize(torch::nn::Module& root, const std::optional<at::Device>& device) {
  if (DeferredInitGuard::active()) {
    throw FailedPreconditionError(
        "materialize_module: called inside tensor_init_context(); leave the "
        "context first");
  }
  Log& log = GetLog();
  std::lock_guard<std::mutex> lock(log.mu);
  internal::ConfirmSetData(log);
  const std::vector<FSDPUnit*> units = UnitsUnder(root);
  Targets targets = CollectTargets(log, root, units);
  for (FSDPUnit* unit : units) {
    FSDPParamGroup& group = unit->param_group();
    if (group.deferred()) group.set_device(device.value_or(group.device()));
  }
  if (!targets.empty()) {
    Replay(log, targets, device);
    // The log is consumed: its other tensors stay on meta.
    log.tensors.clear();
    log.id_of.clear();
    log.ops.clear();
    log.generator_state = at::Tensor();
  }
  for (FSDPUnit* unit : units) unit->param_group().set_deferred(false);
}

}  // namespace

void materialize_module(torch::nn::Module& root) { Materialize(root, std::nullopt); }

void materialize_module(torch::nn::Module& root, const at::Device& device) {
  Materialize(root, device);
}

}  // namespace fsdp
}  // namespace fsdp2
