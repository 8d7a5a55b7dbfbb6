#include "core/script/script_model.h"

#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/serialization/import.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_set>

#include "core/common/error.h"
#include "core/script/internal/unit_call.h"

namespace fsdp2 {
namespace script {
namespace {

// One submodule of the script, with the mirror that stands for it.
struct Node {
  std::string path;  // "" for the root
  torch::jit::Module module;
  std::shared_ptr<torch::nn::Module> mirror;
  int depth = 0;
};

// "__torch__.model.___torch_mangle_3.Block" -> "model.Block": the class as
// Python named it (TorchScript prefixes __torch__ and mangles duplicates).
std::string PythonClassName(const c10::ClassType& type) {
  const auto& name = type.name();
  if (!name) return "";
  std::string out;
  for (const std::string& atom : name->atoms()) {
    if (atom == "__torch__" || atom.rfind("___torch_mangle_", 0) == 0) continue;
    out += (out.empty() ? "" : ".") + atom;
  }
  return out;
}

// Whether `entry` names the class `python_name` ("Block" or a dotted
// suffix of its qualified name, such as "model.Block").
bool NamesClass(const std::string& entry, const std::string& python_name) {
  if (entry == python_name) return true;
  return python_name.size() > entry.size() &&
         python_name.compare(python_name.size() - entry.size(), entry.size(), entry) == 0 &&
         python_name[python_name.size() - entry.size() - 1] == '.';
}

bool IsModuleList(const torch::jit::Module& m) {
  return PythonClassName(*m.type()) == "torch.nn.modules.container.ModuleList";
}

bool HasParameters(const torch::jit::Module& m) {
  for (const auto& p : m.parameters(/*recurse=*/true)) {
    (void)p;
    return true;
  }
  return false;
}

// Builds the mirror of `node` and of everything under it, appending every
// node (pre-order) to `nodes`.
void Mirror(Node node, std::vector<Node>& nodes) {
  for (const auto& p : node.module.named_parameters(/*recurse=*/false)) {
    node.mirror->register_parameter(p.name, p.value, p.value.requires_grad());
  }
  const size_t index = nodes.size();
  nodes.push_back(node);
  for (const auto& child : nodes[index].module.named_children()) {
    Node c;
    c.path = node.path.empty() ? child.name : node.path + "." + child.name;
    c.module = child.value;
    c.mirror = std::make_shared<torch::nn::Module>(PythonClassName(*child.value.type()));
    c.depth = node.depth + 1;
    nodes[index].mirror->register_module(child.name, c.mirror);
    Mirror(std::move(c), nodes);
  }
}

// The nodes `policy` wraps, in pre-order.
std::vector<const Node*> Resolve(const std::vector<Node>& nodes, const ScriptWrapPolicy& policy) {
  std::vector<const Node*> wrapped;
  if (!policy.auto_wrap) {
    std::set<std::string> parents;  // paths of ModuleLists
    for (const Node& n : nodes) {
      if (IsModuleList(n.module)) parents.insert(n.path);
    }
    for (const Node& n : nodes) {
      if (n.path.empty()) continue;
      const size_t dot = n.path.rfind('.');
      const std::string parent = dot == std::string::npos ? "" : n.path.substr(0, dot);
      if (parents.count(parent) != 0 && HasParameters(n.module)) wrapped.push_back(&n);
    }
    return wrapped;
  }
  std::set<const Node*> chosen;
  for (const std::string& entry : *policy.auto_wrap) {
    if (entry.empty()) {
      throw InvalidArgumentError(
          "auto_wrap: the root is always a unit of its own; list submodule paths or class "
          "names");
    }
    bool matched = false;
    for (const Node& n : nodes) {
      if (n.path.empty()) {
        if (entry == n.path || NamesClass(entry, PythonClassName(*n.module.type()))) {
          throw InvalidArgumentError("auto_wrap: \"" + entry +
                                     "\" names the script's root module, which is always a "
                                     "unit of its own; list its submodules instead");
        }
        continue;
      }
      if (n.path == entry || NamesClass(entry, PythonClassName(*n.module.type()))) {
        chosen.insert(&n);
        matched = true;
      }
    }
    if (!matched) {
      std::set<std::string> classes;
      std::string lists;
      for (const Node& n : nodes) {
        if (!n.path.empty()) classes.insert(PythonClassName(*n.module.type()));
        if (IsModuleList(n.module)) lists += (lists.empty() ? "" : ", ") + n.path;
      }
      std::string known;
      for (const std::string& c : classes) known += (known.empty() ? "" : ", ") + c;
      throw InvalidArgumentError(
          "auto_wrap: \"" + entry + "\" is neither a submodule path nor a class of the "
          "script (classes: " + (known.empty() ? "none" : known) + "; ModuleLists: " +
          (lists.empty() ? "none" : lists) + ")");
    }
  }
  for (const Node& n : nodes) {
    if (chosen.count(&n)) wrapped.push_back(&n);
  }
  return wrapped;
}

}  // namespace

ScriptModelImpl::ScriptModelImpl(torch::jit::Module script, const ScriptWrapPolicy& policy)
    : torch::nn::Module(PythonClassName(*script.type())), script_(std::move(script)) {
  if (!script_.find_method("forward")) {
    throw InvalidArgumentError("the TorchScript module has no forward method");
  }
  std::vector<Node> nodes;
  Node root;
  root.module = script_;
  // The root's mirror is this module; Mirror() only borrows it.
  root.mirror = std::shared_ptr<torch::nn::Module>(this, [](torch::nn::Module*) {});
  Mirror(std::move(root), nodes);
  nodes[0].mirror.reset();

  std::vector<const Node*> wrapped = Resolve(nodes, policy);
  // Bottom-up: deeper units first; pre-order among equals.
  std::stable_sort(wrapped.begin(), wrapped.end(),
                   [](const Node* a, const Node* b) { return a->depth > b->depth; });
  std::unordered_set<const c10::ClassType*> types;
  for (const Node* n : wrapped) {
    unit_paths_.push_back(n->path);
    unit_mirrors_.push_back(n->mirror);
    types.insert(n->module.type().get());
    internal::RegisterMirror(n->module._ivalue().get(), n->mirror);
    registered_.push_back(n->module._ivalue().get());
  }
  internal::RewriteSubmoduleCalls(script_, types);
}

ScriptModelImpl::~ScriptModelImpl() {
  for (const c10::ivalue::Object* object : registered_) internal::UnregisterMirror(object);
}

c10::IValue ScriptModelImpl::forward(std::vector<c10::IValue> inputs) {
  return internal::CallUnit(this, script_, std::move(inputs));
}

size_t ScriptModelImpl::num_inputs() const {
  return script_.get_method("forward").function().getSchema().arguments().size() - 1;
}

size_t ScriptModelImpl::num_required_inputs() const {
  const auto& args = script_.get_method("forward").function().getSchema().arguments();
  size_t required = 0;
  for (size_t i = 1; i < args.size(); ++i) {
    if (!args[i].default_value()) required = i;
  }
  return required;
}

std::vector<std::string> ScriptModelImpl::input_names() const {
  std::vector<std::string> names;
  const auto& args = script_.get_method("forward").function().getSchema().arguments();
  for (size_t i = 1; i < args.size(); ++i) names.push_back(args[i].name());
  return names;
}

std::vector<std::shared_ptr<torch::nn::Module>> ScriptModelImpl::fsdp_unit_plan() {
  return unit_mirrors_;
}

ScriptModel LoadScriptModel(const std::string& path, const ScriptWrapPolicy& policy) {
  if (!std::filesystem::is_regular_file(path)) {
    throw IoError("TorchScript file " + path + " does not exist or is not a file");
  }
  // TorchScript runs unoptimised in fsdp2 (for the whole process). LibTorch
  // 2.x's profiling executor re-optimises a graph after its first runs
  // (autodiff subgraphs with their own gradient formulas), so the same block
  // rounded differently on its first and later calls: activation
  // checkpointing's recomputation and a rank that ran the block more often
  // drifted from the plain run in the last bit (LibTorch 1.13 did not). On
  // CPU nothing is fused either way, so this costs no speed.
  torch::jit::setGraphExecutorOptimize(false);
  torch::jit::Module script;
  try {
    script = torch::jit::load(path);
  } catch (const c10::Error& e) {
    throw IoError("cannot load TorchScript file " + path + ": " + e.what_without_backtrace());
  }
  script.train();
  return ScriptModel(std::make_shared<ScriptModelImpl>(std::move(script), policy));
}

}  // namespace script
}  // namespace fsdp2
