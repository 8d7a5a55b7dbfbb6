#include "tests/training_util.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "core/comm/device_mesh.h"
#include "core/models/gpt.h"
#include "core/models/mlp.h"
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

namespace fsdp2 {
namespace testing {
namespace {

// The equivalence tests' GPT: TinyGPT with a wider vocabulary and
// embedding.
models::GPTConfig EquivalenceGPT() {
  models::GPTConfig c = TinyGPT();
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_embd = 32;
  return c;
}

constexpr int64_t kSeqLen = 8;

// One tensor registered twice: as the root's "w" and as "sub.w".
struct TiedSubImpl : torch::nn::Module {
  at::Tensor w;
  at::Tensor forward(const at::Tensor& x) { return at::matmul(x, w); }
};
TORCH_MODULE(TiedSub);

struct TiedImpl : torch::nn::Module {
  TiedImpl() {
    inp = register_module("inp", torch::nn::Linear(16, 8));
    w = register_parameter("w", at::randn({8, 8}) * 0.3);
    sub = register_module("sub", TiedSub());
    sub->w = sub->register_parameter("w", w);
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = torch::relu(fsdp::forward(inp, x));
    h = torch::relu(at::matmul(h, w.t()));
    return head->forward(sub->forward(h));
  }
  torch::nn::Linear inp{nullptr}, head{nullptr};
  TiedSub sub{nullptr};
  at::Tensor w;
};
TORCH_MODULE(Tied);

at::ScalarType Dtype(const TrainSpec& spec) {
  return spec.dtype == "float32" ? at::kFloat : at::kDouble;
}

struct Model {
  std::shared_ptr<torch::nn::Module> root;
  std::vector<std::shared_ptr<torch::nn::Module>> units;  // inner units
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss;
};

Model BuildModel(const TrainSpec& spec) {
  torch::manual_seed(spec.seed);
  Model m;
  if (spec.model == "gpt") {
    models::GPTConfig config = EquivalenceGPT();
    config.dropout = spec.dropout;
    auto gpt = models::GPT(config);
    for (size_t i = 0; i < gpt->blocks->size(); ++i) {
      m.units.push_back(gpt->block(i).ptr());
    }
    m.root = gpt.ptr();
    m.loss = [gpt](const at::Tensor& x, const at::Tensor& y) {
      return models::LanguageModelLoss(fsdp::forward(gpt, x), y);
    };
  } else if (spec.model == "mlp") {
    models::MLPConfig config;
    config.out_features = 3;  // fewer rows than ranks: empty shards
    auto mlp = models::MLP(config);
    for (size_t i = 0; i < mlp->blocks->size(); ++i) {
      m.units.push_back(mlp->block(i).ptr());
    }
    m.root = mlp.ptr();
    m.loss = [mlp](const at::Tensor& x, const at::Tensor& y) {
      return torch::nn::functional::cross_entropy(fsdp::forward(mlp, x), y);
    };
  } else if (spec.model == "conv") {
    auto net = models::ConvNet(1, 6, 3);
    m.units = {net->conv1.ptr(), net->conv2.ptr()};
    m.root = net.ptr();
    m.loss = [net](const at::Tensor& x, const at::Tensor& y) {
      return torch::nn::functional::cross_entropy(fsdp::forward(net, x), y);
    };
  } else if (spec.model == "tied") {
    auto tied = Tied();
    m.units = {tied->inp.ptr()};
    m.root = tied.ptr();
    m.loss = [tied](const at::Tensor& x, const at::Tensor& y) {
      return torch::nn::functional::cross_entropy(fsdp::forward(tied, x), y);
    };
  } else {
    throw std::invalid_argument("unknown model " + spec.model);
  }
  m.root->to(Dtype(spec));
  return m;
}

// The global batch of step `step`: inputs and targets with `rows` rows.
std::pair<at::Tensor, at::Tensor> GlobalBatch(const TrainSpec& spec, int step,
                                              int64_t rows) {
  auto gen = at::detail::createCPUGenerator(spec.seed * 1000003 + step);
  if (spec.model == "gpt") {
    at::Tensor tokens = at::randint(EquivalenceGPT().vocab_size, {rows, kSeqLen + 1},
                                    gen, at::TensorOptions().dtype(at::kLong));
    return {tokens.narrow(1, 0, kSeqLen), tokens.narrow(1, 1, kSeqLen)};
  }
  auto shape = spec.model != "conv" ? std::vector<int64_t>{rows, 16}
                                   : std::vector<int64_t>{rows, 1, 6, 6};
  at::Tensor x = at::randn(shape, gen, at::TensorOptions().dtype(Dtype(spec)));
  at::Tensor y = at::randint(3, {rows}, gen, at::TensorOptions().dtype(at::kLong));
  return {x, y};
}

fsdp::ActivationCheckpointing Policy(const TrainSpec& spec) {
  return fsdp::ActivationCheckpointing::Parse(spec.ac, spec.ac_every);
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const TrainSpec& spec, torch::nn::Module& model) {
  return strategy::MakeOptimizer(model.parameters(), TestOptimizer(spec.optimizer));
}

}  // namespace

models::GPTConfig TinyGPT() {
  models::GPTConfig c;
  c.vocab_size = 32;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

std::vector<at::Tensor> TokenWindows(int64_t vocab_size, int64_t rows) {
  auto gen = at::detail::createCPUGenerator(99);
  at::Tensor tokens =
      at::randint(vocab_size, {rows, 9}, gen, at::TensorOptions().dtype(at::kLong));
  return {tokens.narrow(1, 0, 8).contiguous(), tokens.narrow(1, 1, 8).contiguous()};
}

strategy::OptimizerOptions TestOptimizer(const std::string& kind) {
  strategy::OptimizerOptions o;
  o.kind = strategy::ParseOptimizerKind(kind);
  switch (o.kind) {
    case strategy::OptimizerKind::kAdamW:
      o.lr = 1e-2;
      o.weight_decay = 0.01;
      break;
    case strategy::OptimizerKind::kAdam:
      // No L2 decay: Adam normalises `grad + wd * p`, so parameters whose
      // true gradient is zero (the key slice of an attention bias: softmax
      // ignores a per-query constant) get steps of size ~lr whose sign is
      // set by rounding noise, in any two runs that round differently.
      o.lr = 1e-2;
      o.weight_decay = 0;
      break;
    case strategy::OptimizerKind::kSGD:
      o.lr = 0.1;
      o.momentum = 0.9;
      o.weight_decay = 0;
      break;
  }
  return o;
}

fsdp::FSDPOptions DataParallelOptions(const std::shared_ptr<comm::World>& world) {
  fsdp::FSDPOptions options;
  options.mesh = comm::DeviceMesh::Create(world, {world->size()}, {"dp"});
  return options;
}

void Check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("FAILED: " + what);
}

std::vector<std::string> TrainSpec::ToArgs() const {
  std::ostringstream clip_s;
  clip_s.precision(17);
  clip_s << clip;
  return {model, strategy, std::to_string(steps), std::to_string(batch_per_rank),
          dtype, mixed_precision, std::to_string(grad_accum), clip_s.str(),
          std::to_string(seed), optimizer, ac, std::to_string(ac_every),
          std::to_string(dropout), controls.empty() ? "-" : controls};
}

TrainSpec TrainSpec::FromArgs(const std::vector<std::string>& a) {
  if (a.size() != 14) throw std::invalid_argument("TrainSpec: need 14 args");
  TrainSpec s;
  s.model = a[0];
  s.strategy = a[1];
  s.steps = std::stoi(a[2]);
  s.batch_per_rank = std::stoll(a[3]);
  s.dtype = a[4];
  s.mixed_precision = a[5];
  s.grad_accum = std::stoi(a[6]);
  s.clip = std::stod(a[7]);
  s.seed = std::stoull(a[8]);
  s.optimizer = a[9];
  s.ac = a[10];
  s.ac_every = std::stoi(a[11]);
  s.dropout = std::stod(a[12]);
  s.controls = a[13] == "-" ? "" : a[13];
  return s;
}

std::string TrainSpec::Name() const {
  std::ostringstream s;
  s << model << "/" << strategy << "/" << dtype;
  if (mixed_precision != "none") s << "/mp=" << mixed_precision;
  if (grad_accum > 1) s << "/accum=" << grad_accum;
  if (clip > 0) s << "/clip=" << clip;
  if (optimizer != "adamw") s << "/" << optimizer;
  if (ac != "none") s << "/ac=" << Policy(*this).ToString();
  if (dropout > 0) s << "/dropout=" << dropout;
  if (!controls.empty()) s << "/" << controls;
  return s.str();
}

namespace {

// TrainSpec::controls, parsed.
struct Controls {
  bool reduce_scatter_each = false;
  int forward_prefetch = 1, backward_prefetch = 1;
  int reshard_after_forward_size = 0;
  double divide_factor = 0;  // 0: the data-parallel size
  std::string ignored;
  struct List {
    bool forward;
    int unit;  // an index into Model::units; -1: the root
    std::vector<int> listed;
  };
  std::vector<List> lists;
};

// "r" or an index into Model::units.
int UnitIndex(const std::string& text) { return text == "r" ? -1 : std::stoi(text); }

Controls ParseControls(const std::string& text) {
  Controls c;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "rs") {
      c.reduce_scatter_each = true;
    } else if (key == "fp") {
      c.forward_prefetch = std::stoi(value);
    } else if (key == "bp") {
      c.backward_prefetch = std::stoi(value);
    } else if (key == "raf") {
      c.reshard_after_forward_size = std::stoi(value);
    } else if (key == "div") {
      c.divide_factor = std::stod(value);
    } else if (key == "ignore") {
      c.ignored = value;
    } else if (key == "fl" || key == "bl") {
      const size_t colon = value.find(':');
      if (colon == std::string::npos) throw std::invalid_argument("TrainSpec: " + item);
      Controls::List list{key == "fl", UnitIndex(value.substr(0, colon)), {}};
      std::istringstream listed(value.substr(colon + 1));
      for (std::string unit; std::getline(listed, unit, '+');) {
        list.listed.push_back(UnitIndex(unit));
      }
      c.lists.push_back(std::move(list));
    } else if (!key.empty()) {
      throw std::invalid_argument("TrainSpec: unknown control '" + item + "'");
    }
  }
  return c;
}

}  // namespace

TrainOutput TrainReference(const TrainSpec& spec, int world) {
  Model m = BuildModel(spec);
  // The modules a sharded run checkpoints: every ac_every-th inner unit.
  const auto policy = Policy(spec);
  for (size_t i = 0; policy.enabled() && i < m.units.size(); ++i) {
    if ((i + 1) % (policy.mode == fsdp::ActivationCheckpointing::Mode::kFull
                       ? 1 : policy.every) == 0) {
      fsdp::checkpoint_module(m.units[i]);
    }
  }
  auto optimizer = MakeOptimizer(spec, *m.root);
  const Controls controls = ParseControls(spec.controls);
  // A divide factor F makes the sharded gradient world / F times the mean's.
  const double grad_scale =
      controls.divide_factor > 0 ? world / controls.divide_factor : 1.0;
  TrainOutput out;
  const int64_t rows = world * spec.batch_per_rank * spec.grad_accum;
  for (int step = 0; step < spec.steps; ++step) {
    auto [x, y] = GlobalBatch(spec, step, rows);
    optimizer->zero_grad(/*set_to_none=*/false);
    at::Tensor loss = m.loss(x, y);
    (grad_scale == 1.0 ? loss : loss * grad_scale).backward();
    if (spec.clip > 0) {
      out.grad_norms.push_back(
          torch::nn::utils::clip_grad_norm_(m.root->parameters(), spec.clip));
    }
    optimizer->step();
    out.losses.push_back(loss.item<double>());
  }
  for (const auto& p : m.root->named_parameters()) {
    out.params.emplace_back(p.key(), p.value().detach().clone());
  }
  return out;
}

TrainOutput TrainSharded(const TrainSpec& spec,
                         const std::shared_ptr<comm::World>& world) {
  Model m = BuildModel(spec);
  fsdp::FSDPOptions options;
  if (spec.strategy == "hybrid_shard") {
    const int n = world->size(), replicate = (n % 2 == 0 && n > 2) ? 2 : 1;
    options.mesh = comm::DeviceMesh::Create(world, {replicate, n / replicate},
                                            {"replicate", "shard"});
  } else {
    options = DataParallelOptions(world);
  }
  options.strategy = fsdp::ParseShardingStrategy(spec.strategy);
  const Controls controls = ParseControls(spec.controls);
  options.forward_prefetch = controls.forward_prefetch;
  options.backward_prefetch = controls.backward_prefetch;
  options.reshard_after_forward_size = controls.reshard_after_forward_size;
  if (controls.divide_factor > 0) {
    options.gradient_divide_factor = controls.divide_factor;
  }
  at::Tensor ignored;
  if (!controls.ignored.empty()) {
    const at::Tensor* p = m.root->named_parameters().find(controls.ignored);
    if (p == nullptr) {
      throw std::invalid_argument("TrainSpec: no parameter '" + controls.ignored + "'");
    }
    ignored = *p;
    options.ignored_params.push_back(ignored);
  }
  if (spec.mixed_precision == "bf16") {
    options.mp_policy.param_dtype = at::kBFloat16;
    options.mp_policy.reduce_dtype = at::kFloat;
    options.mp_policy.output_dtype = at::kFloat;
  }
  const std::vector<int64_t> ignored_shape =
      ignored.defined() ? ignored.sizes().vec() : std::vector<int64_t>{};
  for (auto& unit : m.units) fsdp::fully_shard(unit, options);
  fsdp::fully_shard(m.root, options);
  for (const Controls::List& list : controls.lists) {
    auto unit = [&](int i) { return i < 0 ? m.root : m.units.at(static_cast<size_t>(i)); };
    std::vector<std::shared_ptr<torch::nn::Module>> listed;
    for (int i : list.listed) listed.push_back(unit(i));
    if (list.forward) {
      fsdp::set_modules_to_forward_prefetch(*unit(list.unit), listed);
    } else {
      fsdp::set_modules_to_backward_prefetch(*unit(list.unit), listed);
    }
  }
  if (ignored.defined()) {
    Check(ignored.sizes().vec() == ignored_shape,
          "ignored parameter '" + controls.ignored + "' kept whole");
  }
  fsdp::apply_activation_checkpointing(*m.root, Policy(spec));
  auto optimizer = MakeOptimizer(spec, *m.root);
  fsdp::reset_peak_unsharded_param_bytes();
  fsdp::reset_comm_wait_stats(*m.root);

  TrainOutput out;
  const int n = world->size(), rank = world->rank();
  const int64_t B = spec.batch_per_rank;
  for (int step = 0; step < spec.steps; ++step) {
    auto [x, y] = GlobalBatch(spec, step, n * B * spec.grad_accum);
    optimizer->zero_grad(/*set_to_none=*/false);
    double local_loss = 0;
    for (int micro = 0; micro < spec.grad_accum; ++micro) {
      const bool last = micro == spec.grad_accum - 1;
      if (controls.reduce_scatter_each) {
        fsdp::set_requires_all_reduce(*m.root, last);
      } else {
        fsdp::set_requires_gradient_sync(*m.root, last);
      }
      const int64_t start = (int64_t{micro} * n + rank) * B;
      at::Tensor loss = m.loss(x.narrow(0, start, B), y.narrow(0, start, B)) /
                        spec.grad_accum;
      if (step == 0 && micro == 0) {
        // What forward left unsharded, unit by unit (the root's own: the
        // rest of the total).
        int64_t inner = 0;
        for (const auto& unit : m.units) {
          out.after_forward_unsharded.push_back(fsdp::memory_stats(*unit).unsharded_param_bytes);
          inner += out.after_forward_unsharded.back();
        }
        out.after_forward_unsharded.push_back(
            fsdp::memory_stats(*m.root).unsharded_param_bytes - inner);
      }
      loss.backward();
      local_loss += loss.item<double>();
    }
    if (ignored.defined() && ignored.grad().defined()) {
      // Left to us by FSDP: this rank's own gradient, reduced here.
      world->group()->all_reduce(ignored.grad()).wait();
      ignored.grad().div_(controls.divide_factor > 0 ? controls.divide_factor : n);
    }
    if (spec.clip > 0) {
      out.grad_norms.push_back(fsdp::clip_grad_norm_(*m.root, spec.clip));
    }
    optimizer->step();
    at::Tensor global_loss = at::full({1}, local_loss, at::kDouble);
    world->group()->all_reduce(global_loss).wait();
    out.losses.push_back(global_loss.item<double>() / n);
  }
  out.stats = fsdp::memory_stats(*m.root);
  out.peak_unsharded_bytes = fsdp::peak_unsharded_param_bytes();
  std::vector<std::shared_ptr<torch::nn::Module>> units = m.units;
  units.push_back(m.root);
  for (const auto& unit : units) {
    const fsdp::CommWaitStats comm = fsdp::comm_wait_stats(*unit);
    out.all_gathers.push_back(comm.all_gathers);
    out.reductions.push_back(comm.reductions);
  }
  out.params = fsdp::full_state_dict(*m.root);
  return out;
}

void WriteOutput(const std::string& path, const TrainOutput& out) {
  std::ofstream f(path);
  f.precision(17);
  f << "losses";
  for (double v : out.losses) f << " " << v;
  f << "\nnorms";
  for (double v : out.grad_norms) f << " " << v;
  f << "\nstats " << out.stats.sharded_param_bytes << " "
    << out.stats.sharded_grad_bytes << " " << out.stats.unsharded_param_bytes
    << " " << out.stats.unsharded_grad_bytes << " "
    << out.stats.total_param_numel << " " << out.peak_unsharded_bytes << "\n";
  f << "comm";
  for (size_t i = 0; i < out.all_gathers.size(); ++i) {
    f << " " << out.all_gathers[i] << " " << out.reductions[i];
  }
  f << "\nafter_forward";
  for (int64_t b : out.after_forward_unsharded) f << " " << b;
  f << "\n";
  for (const auto& [name, t] : out.params) {
    at::Tensor flat = t.to(at::kDouble).reshape({-1}).contiguous();
    f << "param " << name << " " << flat.numel();
    const double* data = flat.data_ptr<double>();
    for (int64_t i = 0; i < flat.numel(); ++i) f << " " << data[i];
    f << "\n";
  }
}

TrainOutput ReadOutput(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  TrainOutput out;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream s(line);
    std::string kind;
    s >> kind;
    if (kind == "losses" || kind == "norms") {
      auto& v = kind == "losses" ? out.losses : out.grad_norms;
      double x;
      while (s >> x) v.push_back(x);
    } else if (kind == "stats") {
      s >> out.stats.sharded_param_bytes >> out.stats.sharded_grad_bytes >>
          out.stats.unsharded_param_bytes >> out.stats.unsharded_grad_bytes >>
          out.stats.total_param_numel >> out.peak_unsharded_bytes;
    } else if (kind == "comm") {
      for (int64_t g, r; s >> g >> r;) {
        out.all_gathers.push_back(g);
        out.reductions.push_back(r);
      }
    } else if (kind == "after_forward") {
      for (int64_t b; s >> b;) out.after_forward_unsharded.push_back(b);
    } else if (kind == "param") {
      std::string name;
      int64_t numel;
      s >> name >> numel;
      at::Tensor t = at::empty({numel}, at::kDouble);
      double* data = t.data_ptr<double>();
      for (int64_t i = 0; i < numel; ++i) s >> data[i];
      out.params.emplace_back(name, t);
    }
  }
  return out;
}

double MaxLossRelDiff(const TrainOutput& a, const TrainOutput& b, double floor) {
  if (a.losses.size() != b.losses.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]) /
                                std::max(std::abs(b.losses[i]), floor));
  }
  return worst;
}

namespace {

// Calls fn(i, x, y) with the i-th parameters of `a` and `b` as flat float64
// tensors, skipping empty ones; false when the names, the count or a size
// differ.
bool ForEachParamPair(
    const TrainOutput& a, const TrainOutput& b,
    const std::function<void(size_t, const at::Tensor&, const at::Tensor&)>& fn) {
  if (a.params.size() != b.params.size()) return false;
  for (size_t i = 0; i < a.params.size(); ++i) {
    if (a.params[i].first != b.params[i].first) return false;
    at::Tensor x = a.params[i].second.to(at::kDouble).reshape({-1});
    at::Tensor y = b.params[i].second.to(at::kDouble).reshape({-1});
    if (x.numel() != y.numel()) return false;
    if (x.numel() > 0) fn(i, x, y);
  }
  return true;
}

}  // namespace

double MaxParamRelDiff(const TrainOutput& a, const TrainOutput& b, double floor) {
  double worst = 0;
  const bool same = ForEachParamPair(a, b, [&](size_t, const at::Tensor& x, const at::Tensor& y) {
    at::Tensor scale = at::maximum(at::maximum(x.abs(), y.abs()), at::full_like(x, floor));
    worst = std::max(worst, ((x - y).abs() / scale).max().item<double>());
  });
  return same ? worst : INFINITY;
}

double MaxParamAbsDiff(const TrainOutput& a, const TrainOutput& b,
                       std::string* where) {
  double worst = 0;
  const bool same = ForEachParamPair(a, b, [&](size_t i, const at::Tensor& x, const at::Tensor& y) {
    const double diff = (x - y).abs().max().item<double>();
    if (diff > worst && where != nullptr) {
      const int64_t at = (x - y).abs().argmax().item<int64_t>();
      std::ostringstream w;
      w.precision(6);
      w << a.params[i].first << "[" << at << "]: " << x[at].item<double>()
        << " vs " << y[at].item<double>();
      *where = w.str();
    }
    worst = std::max(worst, diff);
  });
  return same ? worst : INFINITY;
}

}  // namespace testing
}  // namespace fsdp2
