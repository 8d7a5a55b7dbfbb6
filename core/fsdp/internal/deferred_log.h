// fsdp2/core/fsdp/internal/deferred_log.h
//
// The op log behind DeferredInitGuard (see deferred_init.h): one
// process-wide, ordered record of the tensors created under a guard and the
// ops that touched them, written by a boxed fallback kernel on LibTorch's
// DeferredInit dispatch key and replayed by materialize_module().
//
// A recorded tensor is a meta tensor. Recorded tensors appear in an op's
// arguments as themselves (looked up by identity at replay); other tensors
// as copies of their value when the op ran. A tensor whose value replay
// cannot reproduce carries a `taint` saying why.
//
// Internal to core/fsdp. Every access to the Log holds Log::mu.
#ifndef FSDP2_CORE_FSDP_INTERNAL_DEFERRED_LOG_H_
#define FSDP2_CORE_FSDP_INTERNAL_DEFERRED_LOG_H_

#include "core/fsdp/internal/visibility.h"  // private to core/fsdp

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fsdp2 {
namespace fsdp {
namespace internal {

constexpr c10::DispatchKey kDeferredInitKey = c10::DispatchKey::DeferredInit;

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

// One recorded op.
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
  std::vector<TensorRecord> tensors;  // a tensor's id is its index
  std::unordered_map<const c10::TensorImpl*, int64_t> id_of;
  std::vector<OpRecord> ops;
  at::Tensor generator_state;  // default CPU generator at the first guard
  bool set_data_pending = false;
};

Log& GetLog();  // the process's log; never destroyed

// The id of recorded tensor `t`, or -1.
int64_t IdOf(const Log& log, const at::Tensor& t);

// Tensor::set_data is not an op: the log sees it ask
// _has_compatible_shallow_copy_type, records it as pending, and confirms
// the swap here, at the next op the log sees or when the log is read.
void ConfirmSetData(Log& log);

// The default CPU generator's state, and setting it.
at::Tensor GeneratorState();
void SetGeneratorState(const at::Tensor& state);

// The device a deferred tensor's creating op asked for; nullopt if `t` is
// not deferred.
c10::optional<at::Device> DeferredDevice(const at::Tensor& t);

bool HoldsTensors(const c10::TypePtr& type);

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

}  // namespace internal
}  // namespace fsdp
}  // namespace fsdp2

#endif  // FSDP2_CORE_FSDP_INTERNAL_DEFERRED_LOG_H_
