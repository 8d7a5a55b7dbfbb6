#include "core/fsdp/internal/deferred_log.h"

#include <ATen/ATen.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>

namespace fsdp2 {
namespace fsdp {
namespace internal {

Log& GetLog() {
  static Log* log = new Log();
  return *log;
}

bool HoldsTensors(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) return HoldsTensors(opt->getElementType());
  if (auto list = type->cast<c10::ListType>()) return HoldsTensors(list->getElementType());
  return false;
}

int64_t IdOf(const Log& log, const at::Tensor& t) {
  if (!t.defined()) return -1;
  auto it = log.id_of.find(t.unsafeGetTensorImpl());
  return it == log.id_of.end() ? -1 : it->second;
}

namespace {

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

}  // namespace

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

namespace {

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
  c10::impl::ExcludeDispatchKeyGuard exclude(kDeferredInitKey);
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

}  // namespace

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

c10::optional<at::Device> DeferredDevice(const at::Tensor& t) {
  if (!t.defined() || !t.is_meta()) return c10::nullopt;
  Log& log = GetLog();
  std::lock_guard<std::mutex> lock(log.mu);
  const int64_t id = IdOf(log, t);
  if (id < 0) return c10::nullopt;
  return log.tensors[id].device;
}

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2
