#include "core/checkpoint/internal/optimizer_state.h"
#include "core/common/error.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace fsdp2 {
namespace checkpoint {
namespace internal {
namespace {

// torch::optim keys a parameter's state by its TensorImpl.
void* StateKey(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

template <typename S>
ParamState FromAdam(const S& s) {
  ParamState out;
  out.step = s.step();
  out.tensors["exp_avg"] = s.exp_avg();
  out.tensors["exp_avg_sq"] = s.exp_avg_sq();
  if (s.max_exp_avg_sq().defined()) out.tensors["max_exp_avg_sq"] = s.max_exp_avg_sq();
  return out;
}

template <typename S>
std::unique_ptr<S> ToAdam(const ParamState& st) {
  auto s = std::make_unique<S>();
  s->step(st.step);
  s->exp_avg(st.tensors.at("exp_avg"));
  s->exp_avg_sq(st.tensors.at("exp_avg_sq"));
  auto m = st.tensors.find("max_exp_avg_sq");
  if (m != st.tensors.end()) s->max_exp_avg_sq(m->second);
  return s;
}

}  // namespace

const std::vector<std::string>& StateKeys() {
  static const std::vector<std::string> keys = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq",
                                                "momentum_buffer"};
  return keys;
}

std::string OptimizerKind(torch::optim::Optimizer* o) {
  if (o == nullptr) return "none";
  if (dynamic_cast<torch::optim::AdamW*>(o)) return "adamw";
  if (dynamic_cast<torch::optim::Adam*>(o)) return "adam";
  if (dynamic_cast<torch::optim::SGD*>(o)) return "sgd";
  throw InvalidArgumentError(
      "checkpoint: optimizer state is saved for AdamW, Adam and SGD only");
}

c10::optional<ParamState> GetState(torch::optim::Optimizer& o, const at::Tensor& p) {
  auto it = o.state().find(StateKey(p));
  if (it == o.state().end()) return c10::nullopt;
  if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) return FromAdam(*s);
  if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) return FromAdam(*s);
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
    ParamState out;
    if (s->momentum_buffer().defined()) out.tensors["momentum_buffer"] = s->momentum_buffer();
    return out;
  }
  return c10::nullopt;
}

void SetState(torch::optim::Optimizer& o, const std::string& kind, const at::Tensor& p,
              const ParamState& st) {
  std::unique_ptr<torch::optim::OptimizerParamState> s;
  if (kind == "adamw") s = ToAdam<torch::optim::AdamWParamState>(st);
  if (kind == "adam") s = ToAdam<torch::optim::AdamParamState>(st);
  if (kind == "sgd") {
    auto sgd = std::make_unique<torch::optim::SGDParamState>();
    auto m = st.tensors.find("momentum_buffer");
    if (m != st.tensors.end()) sgd->momentum_buffer(m->second);
    s = std::move(sgd);
  }
  if (!s) throw InvalidArgumentError("checkpoint: no optimizer state of kind " + kind);
  o.state()[StateKey(p)] = std::move(s);
}

void CheckOptimizerHolds(torch::optim::Optimizer& optimizer,
                         const std::vector<std::pair<std::string, at::Tensor>>& params,
                         const std::string& where) {
  if (params.empty()) return;
  std::set<c10::TensorImpl*> held;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) held.insert(p.unsafeGetTensorImpl());
  }
  for (const auto& [name, p] : params) {
    if (!held.count(p.unsafeGetTensorImpl())) {
      throw IoError(where + ": has optimizer state for '" + name +
                               "', which the optimizer does not hold");
    }
  }
  if (params.size() != held.size()) {
    throw IoError(where + ": has optimizer state for " + std::to_string(params.size()) +
                             " parameters but the optimizer holds " +
                             std::to_string(held.size()));
  }
}

std::string GroupOptionsJson(torch::optim::Optimizer& optimizer, const std::string& kind) {
  nlohmann::json groups = nlohmann::json::array();
  for (auto& group : optimizer.param_groups()) {
    nlohmann::json g;
    if (kind == "adamw" || kind == "adam") {
      auto adam = [&](auto& o) {
        g = {{"lr", o.lr()}, {"beta1", std::get<0>(o.betas())}, {"beta2", std::get<1>(o.betas())},
             {"eps", o.eps()}, {"weight_decay", o.weight_decay()}, {"amsgrad", o.amsgrad()}};
      };
      if (kind == "adamw") adam(static_cast<torch::optim::AdamWOptions&>(group.options()));
      else adam(static_cast<torch::optim::AdamOptions&>(group.options()));
    } else if (kind == "sgd") {
      auto& o = static_cast<torch::optim::SGDOptions&>(group.options());
      g = {{"lr", o.lr()}, {"momentum", o.momentum()}, {"dampening", o.dampening()},
           {"weight_decay", o.weight_decay()}, {"nesterov", o.nesterov()}};
    }
    groups.push_back(g);
  }
  return groups.dump();
}

void SetGroupOptions(torch::optim::Optimizer& optimizer, const std::string& kind,
                     const std::string& json, const std::string& where) {
  const auto groups = nlohmann::json::parse(json);
  if (groups.size() != optimizer.param_groups().size()) {
    throw IoError(where + ": has " + std::to_string(groups.size()) +
                             " optimizer parameter groups but the optimizer has " +
                             std::to_string(optimizer.param_groups().size()));
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    auto& options = optimizer.param_groups()[i].options();
    if (kind == "adamw" || kind == "adam") {
      auto adam = [&](auto& o) {
        o.lr(g.at("lr").get<double>());
        o.betas(std::make_tuple(g.at("beta1").get<double>(), g.at("beta2").get<double>()));
        o.eps(g.at("eps").get<double>());
        o.weight_decay(g.at("weight_decay").get<double>());
        o.amsgrad(g.at("amsgrad").get<bool>());
      };
      if (kind == "adamw") adam(static_cast<torch::optim::AdamWOptions&>(options));
      else adam(static_cast<torch::optim::AdamOptions&>(options));
    } else if (kind == "sgd") {
      auto& o = static_cast<torch::optim::SGDOptions&>(options);
      o.lr(g.at("lr").get<double>());
      o.momentum(g.at("momentum").get<double>());
      o.dampening(g.at("dampening").get<double>());
      o.weight_decay(g.at("weight_decay").get<double>());
      o.nesterov(g.at("nesterov").get<bool>());
    }
  }
}

int64_t RowNumel(const std::vector<int64_t>& global_shape) {
  int64_t n = 1;
  for (size_t d = 1; d < global_shape.size(); ++d) n *= global_shape[d];
  return n;
}

}  // namespace internal
}  // namespace checkpoint
}  // namespace fsdp2
