// fsdp2/core/fsdp/forward_detail.h
//
// How fsdp::forward() (declared and documented in fully_shard.h) runs a
// module: the templates that cast its tensor arguments, flatten its result
// into the tensors the unit hooks and rebuild it, and run a checkpointed
// module's forward as a recomputable region (activation_checkpoint.h).
// Included by fully_shard.h at its end; not a header to include on its own,
// and nothing here is API: every name but forward() is in fsdp::internal.
#ifndef FSDP2_CORE_FSDP_FORWARD_DETAIL_H_
#define FSDP2_CORE_FSDP_FORWARD_DETAIL_H_

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/fsdp/activation_checkpoint.h"

namespace fsdp2 {
namespace fsdp {

class FSDPUnit;

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

// Declared and documented in fully_shard.h.
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

#endif  // FSDP2_CORE_FSDP_FORWARD_DETAIL_H_
