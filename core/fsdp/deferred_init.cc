#include "core/fsdp/deferred_init.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/fsdp/fsdp_unit.h"

namespace fsdp2 {
namespace fsdp {
namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::DeferredInit;

// One tensor created under a guard (a meta tensor), and what the log last
// saw of it: a change made behind the log's back shows as a different
// version or storage.
struct TensorRecord {
  c10::intrusive_ptr<c10::TensorImpl> impl;  // keeps the address unique
  at::Device device{at::kCPU};  // where its creating op wanted it
  std::string taint;            // why replay cannot reproduce it; "": it can
  uint32_t version = 0;
  c10::Storage storage;
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
};

// One recorded op. Recorded tensors appear in `args` as themselves (they are
// looked up by identity at replay); other tensors as copies of their value
// when the op ran.
struct OpRecord {
  // kSetData: self.set_data(from); kAlias: self = a tensor over from's
  // storage with self's recorded geometry (a .data() or other alias made
  // without an op).
  enum Kind { kOp, kSetData, kAlias } kind = kOp;
  c10::optional<c10::OperatorHandle> op;  // kOp only
  std::string name;
  std::vector<c10::IValue> args;
  std::vector<int64_t> outputs;  // per returned tensor: its id, or -1
  int64_t self = -1, from = -1;  // kSetData, kAlias
  std::vector<int64_t> alias_sizes, alias_strides;
  int64_t alias_offset = 0;
  std::vector<std::pair<int64_t, c10::Storage>> touched;  // (id, storage)
  caffe2::TypeMeta default_dtype;
};

struct Log {
  std::mutex mu;
  std::vector<TensorRecord> tensors;
  std::unordered_map<const c10::TensorImpl*, int64_t> id_of;
  std::vector<OpRecord> ops;
  at::Tensor generator_state;  // default CPU generator at the first guard
  bool set_data_pending = false;
};

Log& GetLog() {
  static Log* log = new Log();
  return *log;
}

thread_local int t_guard_depth = 0;

bool HoldsTensors(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) return HoldsTensors(opt->getElementType());
  if (auto list = type->cast<c10::ListType>()) return HoldsTensors(list->getElementType());
  return false;
}

// Calls f on every tensor in `v` (a tensor, a list of tensors or of optional
// tensors).
template <typename F>
void ForEachTensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isList() && HoldsTensors(v.toList().elementType())) {
    for (const c10::IValue& e : v.toList()) ForEachTensor(e, f);
  }
}

// `v` with every tensor t replaced by f(t).
template <typename F>
c10::IValue MapTensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isList() && HoldsTensors(v.toList().elementType())) {
    auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& e : list) out.push_back(MapTensors(e, f));
    return out;
  }
  return v;
}

int64_t IdOf(const Log& log, const at::Tensor& t) {
  if (!t.defined()) return -1;
  auto it = log.id_of.find(t.unsafeGetTensorImpl());
  return it == log.id_of.end() ? -1 : it->second;
}

void Observe(TensorRecord& r) {
  r.version = r.impl->version_counter().current_version();
  r.storage = r.impl->storage();
  r.sizes = r.impl->sizes().vec();
  r.dtype = c10::typeMetaToScalarType(r.impl->dtype());
}

bool ChangedBehindLog(const TensorRecord& r) {
  return r.version != r.impl->version_counter().current_version() ||
         !r.storage.is_alias_of(r.impl->storage());
}

// Marks tensor `id` and every recorded tensor sharing its storage.
void Taint(Log& log, int64_t id, const std::string& why) {
  const c10::StorageImpl* storage = log.tensors[id].storage.unsafeGetStorageImpl();
  for (auto& r : log.tensors) {
    if (r.taint.empty() && (&r == &log.tensors[id] ||
                            r.storage.unsafeGetStorageImpl() == storage)) {
      r.taint = why;
    }
  }
}

// Tensor::set_data is not an op: it asks _has_compatible_shallow_copy_type
// (which the log sees) and then swaps the tensor's data. The swap is
// confirmed here, at the next op the log sees or when the log is read.
void ConfirmSetData(Log& log) {
  if (!log.set_data_pending) return;
  log.set_data_pending = false;
  OpRecord& rec = log.ops.back();
  TensorRecord& self = log.tensors[rec.self];
  const TensorRecord& from = log.tensors[rec.from];
  if (!self.impl->storage().is_alias_of(from.impl->storage()) ||
      self.impl->dtype() != from.impl->dtype() ||
      self.impl->sizes() != from.impl->sizes()) {
    log.ops.pop_back();  // only asked, never swapped
    return;
  }
  Observe(self);
  rec.touched.emplace_back(rec.self, self.storage);
  if (!from.taint.empty() && self.taint.empty()) self.taint = from.taint;
}

int64_t NewRecord(Log& log, const at::Tensor& t, at::Device device) {
  const int64_t id = static_cast<int64_t>(log.tensors.size());
  TensorRecord r;
  r.impl = t.getIntrusivePtr();
  r.device = device;
  Observe(r);
  log.tensors.push_back(std::move(r));
  log.id_of[t.unsafeGetTensorImpl()] = id;
  return id;
}

// A meta tensor the log does not know but whose storage a recorded tensor
// has (made by Tensor::data() or another path that is not an op): recorded
// as an alias of that tensor, so ops on it are logged too. -1 if none.
int64_t RecordAlias(Log& log, const at::Tensor& t) {
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  for (size_t i = 0; i < log.tensors.size(); ++i) {
    if (log.tensors[i].storage.unsafeGetStorageImpl() != storage) continue;
    OpRecord rec;
    rec.kind = OpRecord::kAlias;
    rec.name = "alias";
    rec.from = static_cast<int64_t>(i);
    rec.self = NewRecord(log, t, log.tensors[i].device);
    rec.alias_sizes = t.sizes().vec();
    rec.alias_strides = t.strides().vec();
    rec.alias_offset = t.storage_offset();
    rec.touched.emplace_back(rec.from, log.tensors[i].storage);
    rec.touched.emplace_back(rec.self, log.tensors[rec.self].storage);
    if (!log.tensors[i].taint.empty()) log.tensors[rec.self].taint = log.tensors[i].taint;
    const int64_t id = rec.self;
    log.ops.push_back(std::move(rec));
    return id;
  }
  return -1;
}

std::string OpName(const c10::FunctionSchema& schema) {
  return schema.overload_name().empty() ? schema.name()
                                        : schema.name() + "." + schema.overload_name();
}

// The boxed kernel for DeferredInit: factories make meta tensors, ops on
// recorded tensors run on meta, both are logged; anything else runs as usual.
void DeferredInitFallback(const c10::OperatorHandle& op, c10::DispatchKeySet,
                          torch::jit::Stack* stack) {
  Log& log = GetLog();
  std::lock_guard<std::mutex> lock(log.mu);
  c10::impl::ExcludeDispatchKeyGuard exclude(kKey);
  ConfirmSetData(log);
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t base = stack->size() - num_args;

  bool has_tensor = false;
  std::vector<int64_t> input_ids;
  int device_arg = -1, generator_arg = -1;
  for (size_t i = 0; i < num_args; ++i) {
    ForEachTensor((*stack)[base + i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      has_tensor = true;
      int64_t id = IdOf(log, t);
      if (id < 0 && t.is_meta()) id = RecordAlias(log, t);
      if (id >= 0) input_ids.push_back(id);
    });
    if (schema.arguments()[i].name() == "device") device_arg = static_cast<int>(i);
    if (schema.arguments()[i].name() == "generator") generator_arg = static_cast<int>(i);
  }
  const bool factory = !has_tensor && device_arg >= 0;
  if (input_ids.empty() && !factory) {
    op.callBoxed(stack);
    return;
  }
  const std::string name = OpName(schema);

  if (schema.name() == "aten::_has_compatible_shallow_copy_type" &&
      input_ids.size() == 2) {
    op.callBoxed(stack);
    if (stack->back().toBool()) {
      OpRecord rec;
      rec.kind = OpRecord::kSetData;
      rec.name = "set_data";
      rec.self = input_ids[0];
      rec.from = input_ids[1];
      rec.touched.emplace_back(input_ids[0], log.tensors[input_ids[0]].storage);
      rec.touched.emplace_back(input_ids[1], log.tensors[input_ids[1]].storage);
      log.ops.push_back(std::move(rec));
      log.set_data_pending = true;
    }
    return;
  }

  OpRecord rec;
  rec.op = op;
  rec.name = name;
  rec.default_dtype = at::get_default_dtype();
  std::string taint;
  for (int64_t id : input_ids) {
    TensorRecord& r = log.tensors[id];
    if (ChangedBehindLog(r)) {
      Taint(log, id, "it was changed outside tensor_init_context() before '" +
                         name + "' read it");
    }
    if (taint.empty()) taint = r.taint;
    rec.touched.emplace_back(id, r.storage);
  }
  at::Device out_device = input_ids.empty() ? at::Device(at::kCPU)
                                            : log.tensors[input_ids[0]].device;
  c10::IValue asked_device;  // the device argument as the caller gave it
  if (device_arg >= 0) {
    c10::IValue& device = (*stack)[base + device_arg];
    asked_device = device;
    if (!device.isNone()) {
      out_device = device.toDevice();
    }
    if (factory || !device.isNone()) device = c10::IValue(at::Device(at::kMeta));
  }
  if (factory && out_device.is_meta()) {
    taint = "'" + name + "' created it on the meta device explicitly";
  }
  if (generator_arg >= 0 && !(*stack)[base + generator_arg].isNone()) {
    taint = "'" + name + "' drew from an explicit generator, whose draws replay "
            "cannot reproduce; use the default generator under "
            "tensor_init_context()";
  }
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& arg = (*stack)[base + i];
    // For replay: recorded tensors by identity, other tensors by value now,
    // the device as asked.
    c10::IValue replay = MapTensors(arg, [&](const at::Tensor& t) {
      return !t.defined() || IdOf(log, t) >= 0 ? t : t.clone();
    });
    if (static_cast<int>(i) == device_arg) replay = asked_device;
    rec.args.push_back(std::move(replay));
    // For the meta run: other tensors as meta tensors of the same layout.
    arg = MapTensors(arg, [&](const at::Tensor& t) {
      if (!t.defined() || IdOf(log, t) >= 0 || t.is_meta()) return t;
      return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
    });
  }
  try {
    op.callBoxed(stack);
  } catch (const c10::Error& e) {
    throw std::runtime_error(
        "tensor_init_context(): '" + name + "' cannot run on a deferred (meta) "
        "tensor: " + e.what_without_backtrace() +
        ". Build the model outside the context, or move this computation "
        "after parallelize()");
  }

  const size_t num_returns = schema.returns().size();
  std::vector<int64_t> touched_outputs;
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    ForEachTensor((*stack)[i], [&](const at::Tensor& t) {
      int64_t id = IdOf(log, t);
      if (id < 0 && t.defined() && t.is_meta()) id = NewRecord(log, t, out_device);
      rec.outputs.push_back(id);
      if (id >= 0) touched_outputs.push_back(id);
    });
  }
  // Everything the op wrote: its outputs and its mutable arguments.
  std::vector<int64_t> written = touched_outputs;
  for (size_t i = 0; i < num_args; ++i) {
    const auto* alias = schema.arguments()[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    ForEachTensor(rec.args[i], [&](const at::Tensor& t) {
      const int64_t id = IdOf(log, t);
      if (id >= 0) written.push_back(id);
    });
  }
  // Views share a version counter: re-observe every tensor over a storage
  // the op touched, so a write through one view is not taken for a change
  // behind the log's back on another.
  std::vector<const c10::StorageImpl*> storages;
  for (int64_t id : input_ids) storages.push_back(log.tensors[id].storage.unsafeGetStorageImpl());
  for (int64_t id : input_ids) Observe(log.tensors[id]);
  for (int64_t id : touched_outputs) Observe(log.tensors[id]);
  for (int64_t id : touched_outputs) storages.push_back(log.tensors[id].storage.unsafeGetStorageImpl());
  for (auto& r : log.tensors) {
    if (std::find(storages.begin(), storages.end(), r.storage.unsafeGetStorageImpl()) !=
        storages.end()) {
      Observe(r);
    }
  }
  if (!taint.empty()) {
    for (int64_t id : written) Taint(log, id, taint);
  }
  for (int64_t id : input_ids) rec.touched.emplace_back(id, log.tensors[id].storage);
  for (int64_t id : touched_outputs) rec.touched.emplace_back(id, log.tensors[id].storage);
  log.ops.push_back(std::move(rec));
}

TORCH_LIBRARY_IMPL(_, DeferredInit, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&DeferredInitFallback>());
}

at::Tensor GeneratorState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetGeneratorState(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Where a replayed tensor's value goes: a shard's rows or a whole tensor.
struct Target {
  std::string name;
  at::Tensor tensor;                // keeps its identity, gets the data
  const FSDPParam* param = nullptr;  // null: the full value
};

}  // namespace

DeferredInitGuard::DeferredInitGuard() {
  if (t_guard_depth == 0) {
    Log& log = GetLog();
    std::lock_guard<std::mutex> lock(log.mu);
    ConfirmSetData(log);
    at::Tensor state = GeneratorState();
    if (log.ops.empty()) {
      log.generator_state = state;
    } else if (!at::equal(state, log.generator_state)) {
      throw std::logic_error(
          "tensor_init_context(): the default generator has drawn numbers "
          "since an earlier context whose tensors are not materialised yet; "
          "their replay would no longer match eager construction. "
          "Materialise (parallelize()) before drawing, or build everything "
          "in one context");
    }
    c10::impl::tls_set_dispatch_key_included(kKey, true);
  }
  ++t_guard_depth;
}

DeferredInitGuard::DeferredInitGuard(DeferredInitGuard&& other) noexcept {
  other.engaged_ = false;
}

DeferredInitGuard::~DeferredInitGuard() {
  if (!engaged_) return;
  if (--t_guard_depth == 0) {
    c10::impl::tls_set_dispatch_key_included(kKey, false);
    Log& log = GetLog();
    std::lock_guard<std::mutex> lock(log.mu);
    ConfirmSetData(log);  // a set_data that was the context's last act
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

void materialize_module(torch::nn::Module& root) {
  if (DeferredInitGuard::active()) {
    throw std::logic_error(
        "materialize_module: called inside tensor_init_context(); leave the "
        "context first");
  }
  Log& log = GetLog();
  std::lock_guard<std::mutex> lock(log.mu);
  ConfirmSetData(log);

  // What to materialise, checked before anything is replayed.
  std::unordered_map<int64_t, std::vector<Target>> targets;
  std::unordered_set<const c10::TensorImpl*> handled;
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  auto check = [&](const std::string& name, int64_t id,
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
  };
  const std::vector<FSDPUnit*> units = UnitsUnder(root);
  for (FSDPUnit* unit : units) {
    for (const FSDPParam& p : unit->params()) {
      if (!p.shard.is_meta()) continue;
      auto it = names.find(p.shard.unsafeGetTensorImpl());
      const std::string name = it != names.end() ? it->second : p.name;
      const int64_t id = IdOf(log, p.compute);
      check(name, id, p.global_shape, p.shard.scalar_type(), /*check_storage=*/false);
      targets[id].push_back({name, p.shard, &p});
      handled.insert(p.shard.unsafeGetTensorImpl());
    }
  }
  auto add_full = [&](const std::string& name, const at::Tensor& t) {
    if (!t.defined() || !t.is_meta() || !handled.insert(t.unsafeGetTensorImpl()).second) {
      return;
    }
    const int64_t id = IdOf(log, t);
    check(name, id, t.sizes().vec(), t.scalar_type(), /*check_storage=*/true);
    targets[id].push_back({name, t, nullptr});
  };
  for (const auto& item : root.named_parameters(/*recurse=*/true)) add_full(item.key(), item.value());
  for (const auto& item : root.named_buffers(/*recurse=*/true)) add_full(item.key(), item.value());

  if (!targets.empty()) {
    // A tensor lives from its first op to its last; a target until the last
    // op that touches its final storage (an in-place op through a view).
    const size_t num_ops = log.ops.size();
    std::vector<int64_t> last_ref(log.tensors.size(), -1);
    std::unordered_map<const c10::StorageImpl*, int64_t> last_touch;
    for (size_t i = 0; i < num_ops; ++i) {
      for (const auto& [id, storage] : log.ops[i].touched) {
        last_ref[id] = static_cast<int64_t>(i);
        last_touch[storage.unsafeGetStorageImpl()] = static_cast<int64_t>(i);
      }
    }
    std::vector<std::vector<int64_t>> write_after(num_ops), release_after(num_ops);
    for (size_t id = 0; id < log.tensors.size(); ++id) {
      int64_t end = last_ref[id];
      if (targets.count(id)) {
        end = std::max(end, last_touch[log.tensors[id].storage.unsafeGetStorageImpl()]);
        write_after.at(end).push_back(static_cast<int64_t>(id));
      }
      if (end >= 0) release_after[end].push_back(static_cast<int64_t>(id));
    }

    at::Tensor state_now = GeneratorState();
    if (!at::equal(state_now, log.generator_state)) {
      std::cerr << "fsdp2: warning: the default generator drew numbers between "
                   "tensor_init_context() and materialisation; those draws "
                   "repeated the deferred initialisation's first numbers and "
                   "no longer count: the generator is now where eager "
                   "construction would have left it\n";
    }
    at::NoGradGuard no_grad;
    const caffe2::TypeMeta default_dtype = at::get_default_dtype();
    SetGeneratorState(log.generator_state);
    std::vector<at::Tensor> real(log.tensors.size());
    auto lookup = [&](const at::Tensor& t) -> at::Tensor {
      const int64_t id = IdOf(log, t);
      if (id < 0) return t;
      TORCH_INTERNAL_ASSERT(real[id].defined(), "deferred init replay: tensor ", id,
                            " used before it was created or after release");
      return real[id];
    };
    try {
      for (size_t i = 0; i < num_ops; ++i) {
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
          for (const auto& arg : rec.args) stack.push_back(MapTensors(arg, lookup));
          rec.op->callBoxed(&stack);
          size_t k = 0;
          for (const auto& v : stack) {
            ForEachTensor(v, [&](const at::Tensor& t) {
              const int64_t id = k < rec.outputs.size() ? rec.outputs[k] : -1;
              ++k;
              if (id >= 0) real[id] = t;
            });
          }
        }
        for (int64_t id : write_after[i]) {
          const at::Tensor& full = real[id];
          for (const Target& target : targets[id]) {
            if (target.param != nullptr) {
              const FSDPParam& p = *target.param;
              at::Tensor shard = full.reshape({p.rows, p.row_numel})
                                     .narrow(0, p.row_start, p.local_rows)
                                     .clone(at::MemoryFormat::Contiguous)
                                     .view(target.tensor.sizes());
              internal::AssignData(target.tensor, shard);
            } else {
              const bool owns_storage = full.storage_offset() == 0 &&
                                        full.is_contiguous() &&
                                        full.storage().nbytes() == full.nbytes();
              internal::AssignData(target.tensor, owns_storage ? full : full.clone());
            }
          }
        }
        for (int64_t id : release_after[i]) real[id] = at::Tensor();
      }
    } catch (...) {
      at::set_default_dtype(default_dtype);
      throw;
    }
    at::set_default_dtype(default_dtype);
    // The log is consumed: its other tensors stay on meta.
    log.tensors.clear();
    log.id_of.clear();
    log.ops.clear();
    log.generator_state = at::Tensor();
  }
  for (FSDPUnit* unit : units) unit->set_deferred(false);
}

namespace internal {

c10::optional<at::Device> DeferredDevice(const at::Tensor& t) {
  if (!t.defined() || !t.is_meta()) return c10::nullopt;
  Log& log = GetLog();
  std::lock_guard<std::mutex> lock(log.mu);
  const int64_t id = IdOf(log, t);
  if (id < 0) return c10::nullopt;
  return log.tensors[id].device;
}

void AssignData(const at::Tensor& t, const at::Tensor& data) {
  if (at::_has_compatible_shallow_copy_type(t, data)) {
    t.set_data(data);
  } else {
    t.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
  }
}

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2
