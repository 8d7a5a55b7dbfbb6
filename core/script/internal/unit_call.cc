#include "core/script/internal/unit_call.h"

#include <ATen/core/function_schema.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <mutex>
#include <unordered_map>

#include "core/fsdp/activation_checkpoint.h"
#include "core/fsdp/fully_shard.h"

namespace fsdp2 {
namespace script {
namespace internal {
namespace {

using c10::IValue;

constexpr const char* kUnitForward = "fsdp2::unit_forward";

// ---- the mirror registry

struct Registry {
  std::mutex mu;
  std::unordered_map<const c10::ivalue::Object*, std::weak_ptr<torch::nn::Module>> mirrors;
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: used at exit by late calls
  return *r;
}

std::shared_ptr<torch::nn::Module> FindMirror(const c10::ivalue::Object* object) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.mirrors.find(object);
  return it == r.mirrors.end() ? nullptr : it->second.lock();
}

// ---- the tensors inside TorchScript values

void Flatten(const IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const IValue& e : v.toTupleRef().elements()) Flatten(e, out);
  } else if (v.isList()) {
    for (const IValue& e : v.toListRef()) Flatten(e, out);
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) Flatten(kv.value(), out);
  }
}

// `shape` with its tensors replaced, in Flatten's order, by tensors[i...].
IValue Rebuild(const IValue& shape, const std::vector<at::Tensor>& tensors, size_t& i) {
  if (shape.isTensor()) return tensors.at(i++);
  if (shape.isTuple()) {
    const auto& tuple = shape.toTupleRef();
    std::vector<IValue> elements;
    elements.reserve(tuple.elements().size());
    for (const IValue& e : tuple.elements()) elements.push_back(Rebuild(e, tensors, i));
    // The code that reads it indexes it by position (a NamedTuple's names
    // are resolved at compile time).
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  if (shape.isList()) {
    c10::impl::GenericList list(shape.toList().elementType());
    for (const IValue& e : shape.toListRef()) list.push_back(Rebuild(e, tensors, i));
    return list;
  }
  if (shape.isGenericDict()) {
    const auto dict = shape.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& kv : dict) out.insert(kv.key(), Rebuild(kv.value(), tensors, i));
    return out;
  }
  return shape;
}

// `v` with every tensor inside it replaced by an undefined one: the
// structure to rebuild from, holding no tensor memory.
IValue Skeleton(const IValue& v) {
  std::vector<at::Tensor> flat;
  Flatten(v, flat);
  std::vector<at::Tensor> none(flat.size());
  size_t i = 0;
  return Rebuild(v, none, i);
}

// `module.forward(*packed_args)`. A jit::Module is a handle: the copy runs
// the same object.
IValue Forward(torch::jit::Module module, const IValue& packed_args) {
  return module.forward(packed_args.toTupleRef().elements().vec());
}

// ---- the operator

void UnitForwardOp(torch::jit::Stack& stack) {
  IValue args = torch::jit::pop(stack);
  IValue self = torch::jit::pop(stack);
  auto object = self.toObject();
  std::shared_ptr<torch::nn::Module> mirror = FindMirror(object.get());
  std::vector<IValue> list;
  for (const IValue& a : args.toListRef()) list.push_back(a);
  torch::jit::push(stack, CallUnit(mirror.get(), torch::jit::Module(object), std::move(list)));
}

// Side effects (collectives, storage swaps): never reordered, merged or
// removed by the graph passes.
torch::jit::RegisterOperators register_unit_forward({torch::jit::Operator(
    "fsdp2::unit_forward(Any self, Any[] args) -> Any", UnitForwardOp,
    c10::AliasAnalysisKind::CONSERVATIVE)});

int RewriteBlock(torch::jit::Block* block, const std::unordered_set<const c10::ClassType*>& types) {
  int replaced = 0;
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    torch::jit::Node* node = *it;
    ++it;  // `node` may be destroyed below
    for (torch::jit::Block* inner : node->blocks()) replaced += RewriteBlock(inner, types);
    if (node->kind() != c10::prim::CallMethod || node->s(c10::attr::name) != "forward") continue;
    auto callee = node->input(0)->type()->cast<c10::ClassType>();
    if (!callee || types.count(callee.get()) == 0) continue;
    torch::jit::Graph* graph = node->owningGraph();
    torch::jit::WithInsertPoint guard(node);
    std::vector<torch::jit::Value*> args(node->inputs().begin() + 1, node->inputs().end());
    torch::jit::Value* list =
        graph->insertNode(graph->createList(c10::AnyType::get(), args))->output();
    torch::jit::Value* result =
        graph->insert(c10::Symbol::fromQualString(kUnitForward), {node->input(0), list});
    torch::jit::Value* typed =
        graph->insertUncheckedCast(result, node->output()->type());
    node->output()->replaceAllUsesWith(typed);
    node->destroy();
    ++replaced;
  }
  return replaced;
}

}  // namespace

IValue CallUnit(torch::nn::Module* mirror, const torch::jit::Module& module,
                std::vector<IValue> args) {
  fsdp::FSDPUnit* unit = mirror ? fsdp::internal::FindUnit(mirror) : nullptr;
  const bool checkpointed = mirror != nullptr && fsdp::internal::UseCheckpoint(mirror);
  IValue packed = c10::ivalue::Tuple::create(std::move(args));
  if (unit == nullptr && !checkpointed) return Forward(module, packed);
  if (unit != nullptr) fsdp::internal::PreForward(unit);
  try {
    std::vector<at::Tensor> inputs;
    Flatten(packed, inputs);
    if (unit != nullptr) {
      for (at::Tensor& t : inputs) t = fsdp::internal::CastInput(unit, t);
    }
    IValue out;
    if (checkpointed) {
      // The recomputation rebuilds the arguments around the tensors the
      // checkpoint kept; the first run records the result's structure.
      struct Shape {
        IValue args;
        c10::optional<IValue> out;
      };
      auto shape = std::make_shared<Shape>();
      shape->args = Skeleton(packed);
      fsdp::internal::RunFn run = [module, shape](const std::vector<at::Tensor>& tensors) {
        size_t i = 0;
        IValue result = Forward(module, Rebuild(shape->args, tensors, i));
        std::vector<at::Tensor> flat;
        Flatten(result, flat);
        if (!shape->out) shape->out = Skeleton(result);
        return flat;
      };
      packed = IValue();  // the checkpoint keeps the tensors it needs
      std::vector<at::Tensor> flat =
          fsdp::internal::CheckpointForward(unit, mirror, std::move(run), std::move(inputs));
      size_t i = 0;
      out = Rebuild(*shape->out, flat, i);
    } else {
      size_t i = 0;
      IValue cast = Rebuild(packed, inputs, i);
      packed = IValue();
      inputs.clear();
      out = Forward(module, cast);
    }
    if (unit != nullptr) {
      std::vector<at::Tensor> flat;
      Flatten(out, flat);
      flat = fsdp::internal::PostForward(unit, std::move(flat));
      size_t i = 0;
      out = Rebuild(out, flat, i);
    }
    return out;
  } catch (...) {
    if (unit != nullptr) fsdp::internal::AbortForward(unit);
    throw;
  }
}

void RegisterMirror(const c10::ivalue::Object* object,
                    const std::shared_ptr<torch::nn::Module>& mirror) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.mirrors[object] = mirror;
}

void UnregisterMirror(const c10::ivalue::Object* object) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.mirrors.erase(object);
}

int RewriteSubmoduleCalls(const torch::jit::Module& script,
                          const std::unordered_set<const c10::ClassType*>& types) {
  if (types.empty()) return 0;
  int replaced = 0;
  std::unordered_set<const c10::ClassType*> seen;  // classes share their code
  for (const torch::jit::Module& m : script.modules()) {
    const c10::ClassTypePtr type = m.type();
    if (!seen.insert(type.get()).second) continue;
    for (torch::jit::Function* fn : type->methods()) {
      auto* graph_fn = dynamic_cast<torch::jit::GraphFunction*>(fn);
      if (graph_fn == nullptr) continue;
      replaced += RewriteBlock(graph_fn->graph()->block(), types);
    }
  }
  return replaced;
}

}  // namespace internal
}  // namespace script
}  // namespace fsdp2
