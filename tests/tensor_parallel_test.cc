// Tensor parallelism (core/tp) and FSDP2Strategy's (dp, tp) mesh.
//
// - TP layers alone, on 2, 3 and 4 ranks: column-wise Linear (gathered,
//   fused q/k/v, sharded output), column -> row-wise MLP, row-wise Linear
//   on a replicated input, vocab-parallel and column-wise Embedding give the
//   plain module's outputs, input gradients and (blocks of) weight
//   gradients within 1e-12, and full_from_local rebuilds the plain weights.
// - Training GPT through FSDP2Strategy with (dp, tp) = (1, 2), (2, 2),
//   (1, 3), (1, 4) (FULL_SHARD) and (2, 2) (NO_SHARD, SHARD_GRAD_OP) in
//   float64 equals one process: the same loss and clipped
//   gradient norm at every step and the same full parameters (original
//   names and shapes) after the last AdamW step, starting from a full state
//   dict loaded into the parallel model.
// - "auto" resolution and every error: sizes that do not multiply to the
//   world, a size that does not divide it, HYBRID_SHARD with tp, heads that
//   tp does not divide, a model without a plan, uneven layer splits, plan
//   entries that match nothing or a non-Linear module, TP after FSDP,
//   wrong shapes in load_model_state_dict. (Checkpoints of tensor-parallel
//   runs: tp_checkpoint_test.)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/comm/world.h"
#include "core/fsdp/fully_shard.h"
#include "core/strategy/fsdp2_strategy.h"
#include "core/tp/parallelize.h"
#include "tests/harness/multi_process.h"
#include "tests/strategy_util.h"

namespace fsdp2 {
namespace testing {
namespace {

using strategy::Batch;
using tp::ParallelStyle;

void ExpectClose(const std::string& what, const at::Tensor& got,
                 const at::Tensor& want, double tol = 1e-12) {
  Check(got.sizes() == want.sizes(),
        what + ": shape " + c10::str(got.sizes()) + " vs " + c10::str(want.sizes()));
  const double diff = (got - want).abs().max().item<double>();
  Check(diff <= tol, what + ": max |diff| " + std::to_string(diff));
}

// Runs `fn` and checks it throws std::invalid_argument mentioning `text`.
template <typename Fn>
void ExpectInvalid(const std::string& what, const std::string& text, Fn fn) {
  ExpectThrows<std::invalid_argument>(what, text, fn);
}

// A holder for two layers named "a" and "b" (b optional).
struct TwoLayers : torch::nn::Module {
  TwoLayers(std::shared_ptr<torch::nn::Module> a, std::shared_ptr<torch::nn::Module> b) {
    register_module("a", std::move(a));
    if (b) register_module("b", std::move(b));
  }
};

std::shared_ptr<torch::nn::Module> Clone(const std::shared_ptr<torch::nn::Module>& m) {
  auto copy = m->clone();
  return copy;
}

// One layer case: `plain` and a copy made tensor-parallel with `plan`; `run`
// maps (net, input) to the output, `block` maps a plain output to what this
// rank's output must be (identity for replicated outputs).
struct Case {
  std::string name;
  std::shared_ptr<torch::nn::Module> a, b;
  tp::TensorParallelPlan plan;
  at::Tensor input;
  std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> run;
  std::function<at::Tensor(const at::Tensor&)> block = [](const at::Tensor& t) { return t; };
};

void CheckCase(const Case& c, const std::shared_ptr<comm::ProcessGroup>& group) {
  auto plain = std::make_shared<TwoLayers>(c.a, c.b);
  auto par = std::make_shared<TwoLayers>(Clone(c.a), c.b ? Clone(c.b) : nullptr);
  tp::parallelize_module(par, group, c.plan);
  const bool floating = c.input.is_floating_point();
  at::Tensor x1 = floating ? c.input.clone().requires_grad_() : c.input;
  at::Tensor x2 = floating ? c.input.clone().requires_grad_() : c.input;
  at::Tensor y1 = c.run(*plain, x1);
  at::Tensor y2 = c.run(*par, x2);
  ExpectClose(c.name + " output", y2, c.block(y1));
  auto gen = at::detail::createCPUGenerator(17);
  at::Tensor w = at::randn(y1.sizes(), gen, y1.options());
  (y1 * w).sum().backward();
  (y2 * c.block(w)).sum().backward();
  if (floating) ExpectClose(c.name + " input grad", x2.grad(), x1.grad());
  std::map<std::string, tp::ShardedParameter> split;
  for (auto& p : tp::sharded_parameters(*par)) split.emplace(p.name, p);
  Check(!split.empty(), c.name + ": nothing was split");
  auto want = plain->named_parameters();
  for (const auto& item : par->named_parameters()) {
    const at::Tensor& full = want[item.key()];
    auto it = split.find(item.key());
    if (it == split.end()) {
      ExpectClose(c.name + " " + item.key() + " (replicated)", item.value(), full);
      ExpectClose(c.name + " " + item.key() + " grad", item.value().grad(), full.grad());
    } else {
      ExpectClose(c.name + " " + item.key() + " block",
                  item.value(), tp::local_from_full(it->second, full));
      ExpectClose(c.name + " " + item.key() + " grad block", item.value().grad(),
                  tp::local_from_full(it->second, full.grad()));
      ExpectClose(c.name + " " + item.key() + " full_from_local",
                  tp::full_from_local(it->second, item.value()), full);
    }
  }
}

at::Tensor Run(const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x) {
  if (auto l = std::dynamic_pointer_cast<torch::nn::LinearImpl>(m)) {
    return tp::forward(torch::nn::Linear(l), x);
  }
  return tp::forward(
      torch::nn::Embedding(std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(m)), x);
}

at::Tensor RunA(torch::nn::Module& net, const at::Tensor& x) {
  return Run(net.named_children()["a"], x);
}

// args: none. The whole world is one tensor-parallel group.
FSDP2_SCENARIO(tp_layers) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  auto group = world->group();
  const int64_t tp = group->size(), r = group->rank();
  torch::manual_seed(3);  // every rank builds the same plain modules
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto linear = [&](int64_t in, int64_t out, bool bias = true) {
    torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(bias));
    l->to(at::kDouble);
    return std::static_pointer_cast<torch::nn::Module>(l.ptr());
  };
  auto embedding = [&](int64_t rows, int64_t dims) {
    torch::nn::Embedding e(rows, dims);
    e->to(at::kDouble);
    return std::static_pointer_cast<torch::nn::Module>(e.ptr());
  };
  at::Tensor x = at::randn({2, 3, 12}, f64);
  at::Tensor ids = at::randint(12, {2, 5}, at::TensorOptions().dtype(at::kLong));
  std::vector<Case> cases;
  cases.push_back({"colwise gathered", linear(12, 36), nullptr,
                   {{"a", ParallelStyle::Colwise(true)}}, x, RunA});
  cases.push_back({"colwise fused qkv gathered", linear(12, 36), nullptr,
                   {{"a", ParallelStyle::Colwise(true, 3)}}, x, RunA});
  Case sharded{"colwise fused qkv sharded output", linear(12, 36), nullptr,
               {{"a", ParallelStyle::Colwise(false, 3)}}, x, RunA};
  sharded.block = [&](const at::Tensor& y) {  // rank r's part of q, k and v
    return y.reshape({2, 3, 3, tp, 12 / tp}).select(3, r).reshape({2, 3, 36 / tp});
  };
  cases.push_back(sharded);
  cases.push_back({"colwise -> rowwise MLP", linear(12, 24), linear(24, 12),
                   {{"a", ParallelStyle::Colwise()}, {"b", ParallelStyle::Rowwise()}},
                   x, [](torch::nn::Module& net, const at::Tensor& in) {
                     auto ch = net.named_children();
                     return Run(ch["b"], at::gelu(Run(ch["a"], in)));
                   }});
  cases.push_back({"rowwise on a replicated input", linear(12, 8), nullptr,
                   {{"a", ParallelStyle::Rowwise(/*input_is_sharded=*/false)}}, x,
                   RunA});
  cases.push_back({"rowwise without bias", linear(24, 8, false), nullptr,
                   {{"a", ParallelStyle::Rowwise(false)}}, at::randn({4, 24}, f64),
                   RunA});
  cases.push_back({"vocab-parallel embedding", embedding(12, 6), nullptr,
                   {{"a", ParallelStyle::Rowwise()}}, ids, RunA});
  cases.push_back({"colwise embedding gathered", embedding(12, 12), nullptr,
                   {{"a", ParallelStyle::Colwise(true)}}, ids, RunA});
  Case emb_sharded{"colwise embedding sharded output", embedding(12, 12), nullptr,
                   {{"a", ParallelStyle::Colwise()}}, ids, RunA};
  emb_sharded.block = [&](const at::Tensor& y) { return y.chunk(tp, -1)[r]; };
  cases.push_back(emb_sharded);
  for (const auto& c : cases) CheckCase(c, group);

  // Errors, all before any parameter changes.
  auto net = [&](std::shared_ptr<torch::nn::Module> a) {
    return std::make_shared<TwoLayers>(std::move(a), nullptr);
  };
  if (tp > 1) {
    ExpectInvalid("uneven column split", "cannot be split evenly", [&] {
      tp::parallelize_module(net(linear(12, 36 * tp + 1)), group,
                             {{"a", ParallelStyle::Colwise()}});
    });
    ExpectInvalid("uneven row split", "choose a tensor_parallel_size", [&] {
      tp::parallelize_module(net(linear(tp + 1, 4)), group, {{"a", ParallelStyle::Rowwise()}});
    });
  }
  auto untouched = net(linear(12, 36));
  ExpectInvalid("unmatched entry", "matches no module", [&] {
    tp::parallelize_module(untouched, group,
                           {{"a", ParallelStyle::Colwise()}, {"nope.*", ParallelStyle::Rowwise()}});
  });
  Check(!tp::is_tensor_parallel(*untouched->named_children()["a"]) &&
            untouched->named_parameters()["a.weight"].size(0) == 36,
        "a refused plan changed the model");
  ExpectInvalid("not a Linear", "Linear and Embedding only", [&] {
    tp::parallelize_module(
        net(torch::nn::LayerNorm(torch::nn::LayerNormOptions({12})).ptr()), group,
        {{"a", ParallelStyle::Colwise()}});
  });
  ExpectInvalid("row-wise padding_idx", "padding_idx", [&] {
    tp::parallelize_module(
        net(torch::nn::Embedding(torch::nn::EmbeddingOptions(12, 4).padding_idx(0)).ptr()),
        group, {{"a", ParallelStyle::Rowwise()}});
  });
  auto twice = net(linear(12, 36));
  tp::parallelize_module(twice, group, {{"a", ParallelStyle::Colwise()}});
  ExpectInvalid("twice", "already tensor-parallel", [&] {
    tp::parallelize_module(twice, group, {{"a", ParallelStyle::Colwise()}});
  });
  auto sharded_first = net(linear(12, 36));
  fsdp::fully_shard(sharded_first, DataParallelOptions(world));  // tp: the whole world
  ExpectInvalid("after fully_shard", "apply tensor parallelism first", [&] {
    tp::parallelize_module(sharded_first, group, {{"a", ParallelStyle::Colwise()}});
  });
  group->barrier().wait();
}

TEST(TensorParallelLayers, EqualPlainModulesOn2To4Ranks) {
  for (int n : {2, 3, 4}) {
    auto r = LaunchScenario("tp_layers", n, {}, std::chrono::seconds(120));
    ASSERT_TRUE(r.ok()) << "tp=" << n << "\n" << r.Describe();
  }
}

// ---------------------------------------------------------------------------
// Training through FSDP2Strategy.

constexpr uint64_t kSeed = 11;         // the strategy's seed
constexpr uint64_t kInitSeed = 1234;   // the full state dict every run loads
constexpr uint64_t kSamplerSeed = 5;
constexpr int64_t kGlobalBatch = 12;
constexpr int64_t kRows = 96;
constexpr double kClip = 0.5;

Batch Dataset() { return TokenWindows(HeadsGPT().vocab_size, kRows); }

// The full state dict every run starts from (not the strategy's seed, so
// loading it into the parallel model is what makes the runs agree).
std::vector<std::pair<std::string, at::Tensor>> InitialState() {
  return InitialGPTState(HeadsGPT(), kInitSeed);
}

strategy::DistributedSamplerOptions SamplerOptions() {
  return TestSamplerOptions(kSamplerSeed, kGlobalBatch);
}

strategy::FSDP2StrategyOptions Options() { return TestStrategyOptions(kSeed, kSamplerSeed); }

// args: dp tp ("auto" or a number), expected dp, expected tp, steps,
// sharding strategy.
FSDP2_SCENARIO(tp_train) {
  auto o = Options();
  o.data_parallel_size = strategy::ParallelSize::Parse(args.at(0));
  o.tensor_parallel_size = strategy::ParallelSize::Parse(args.at(1));
  o.sharding_strategy = fsdp::ParseShardingStrategy(args.at(5));
  const int steps = std::stoi(args.at(4));
  strategy::FSDP2Strategy s(o);
  s.setup_environment();
  Check(s.data_parallel_size() == std::stoi(args.at(2)) &&
            s.tensor_parallel_size() == std::stoi(args.at(3)),
        "resolved (dp, tp) = (" + std::to_string(s.data_parallel_size()) + ", " +
            std::to_string(s.tensor_parallel_size()) + ")");
  Check(s.mesh()->ToString() == "DeviceMesh(dp=" + args.at(2) + ", tp=" + args.at(3) + ")",
        "mesh " + s.mesh()->ToString());
  auto module = TestGPTModule(HeadsGPT());
  s.connect(module);
  s.parallelize();
  const int rank = s.world()->rank();
  const auto initial = InitialState();
  s.load_model_state_dict(initial);
  // Round trip: the full state dict is the one loaded, exactly.
  auto loaded = s.lightning_module_state_dict();
  Check(loaded.size() == initial.size(), "state dict size");
  for (size_t i = 0; i < initial.size(); ++i) {
    Check(loaded[i].first == initial[i].first && loaded[i].second.equal(initial[i].second),
          "state dict round trip: " + initial[i].first);
  }
  auto wrong = initial;
  for (auto& [name, value] : wrong) {
    if (name == "blocks.0.attn.qkv.weight") value = value.narrow(0, 0, 24);
  }
  ExpectInvalid("wrong shape", "blocks.0.attn.qkv.weight", [&] { s.load_model_state_dict(wrong); });
  auto loader = s.process_dataloader(Dataset(), kGlobalBatch);
  std::ofstream out(WorkerOutDir() + "/losses" + std::to_string(rank) + ".txt");
  out.precision(17);
  for (int i = 0; i < steps; ++i) {
    at::Tensor loss = s.training_step(loader.batch(i), i);
    s.backward(loss);
    const double norm = s.optimizer_step(kClip);
    out << s.reduce(loss).item<double>() << " " << norm << "\n";
  }
  auto full = s.lightning_module_state_dict(/*rank0_only=*/true);
  if (rank == 0) {
    std::vector<at::Tensor> values;
    std::ofstream names(WorkerOutDir() + "/names.txt");
    for (auto& [name, value] : full) {
      values.push_back(value);
      names << name << "\n";
    }
    torch::save(values, WorkerOutDir() + "/params.pt");
  }
  s.barrier();
}

// One process from InitialState(): losses, clipped norms, final parameters.
struct Expected {
  ReferenceRun run;
  std::vector<std::pair<std::string, at::Tensor>> params;
};

Expected Reference(int steps) {
  auto m = TestGPTModule(HeadsGPT());
  {
    at::NoGradGuard no_grad;
    auto params = m->module()->named_parameters();
    for (const auto& [name, value] : InitialState()) params[name].copy_(value);
  }
  const strategy::DistributedSampler sampler(kRows, 0, 1, SamplerOptions());
  Expected expected{TrainOneProcess(*m, Dataset(), sampler, steps, kClip), {}};
  for (const auto& item : m->module()->named_parameters()) {
    expected.params.emplace_back(item.key(), item.value().detach());
  }
  return expected;
}

TEST(FSDP2StrategyTensorParallel, TrainsLikeOneProcess) {
  const int steps = 4;
  const Expected ref = Reference(steps);
  struct Layout {
    std::string dp, tp;
    int world, want_dp, want_tp;
    std::string strategy;
  };
  for (const Layout& l : std::vector<Layout>{
           {"auto", "2", 2, 1, 2, "full_shard"},
           {"2", "auto", 4, 2, 2, "full_shard"},
           {"1", "3", 3, 1, 3, "full_shard"},
           {"auto", "4", 4, 1, 4, "full_shard"},
           {"2", "2", 4, 2, 2, "no_shard"},
           {"2", "2", 4, 2, 2, "shard_grad_op"}}) {
    const std::string name = "(dp, tp) = (" + l.dp + ", " + l.tp + ") " + l.strategy;
    auto r = LaunchScenario("tp_train", l.world,
                            {l.dp, l.tp, std::to_string(l.want_dp), std::to_string(l.want_tp),
                             std::to_string(steps), l.strategy},
                            std::chrono::seconds(240));
    ASSERT_TRUE(r.ok()) << name << "\n" << r.Describe();
    double worst_loss = 0, worst_norm = 0, worst_param = 0;
    for (int rank = 0; rank < l.world; ++rank) {
      std::ifstream in(r.out_dir + "/losses" + std::to_string(rank) + ".txt");
      for (int i = 0; i < steps; ++i) {
        double loss = 0, norm = 0;
        ASSERT_TRUE(in >> loss >> norm) << name << " rank " << rank << " step " << i;
        const double want_loss = ref.run.losses[i], want_norm = ref.run.grad_norms[i];
        EXPECT_NEAR(loss, want_loss, 1e-11 * want_loss) << name << " step " << i;
        EXPECT_NEAR(norm, want_norm, 1e-9 * want_norm) << name << " step " << i;
        worst_loss = std::max(worst_loss, std::abs(loss - want_loss) / want_loss);
        worst_norm = std::max(worst_norm, std::abs(norm - want_norm) / want_norm);
      }
    }
    std::vector<at::Tensor> values;
    torch::load(values, r.out_dir + "/params.pt");
    std::ifstream names(r.out_dir + "/names.txt");
    ASSERT_EQ(values.size(), ref.params.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      std::string got;
      names >> got;
      EXPECT_EQ(got, ref.params[i].first) << name;
      ASSERT_EQ(values[i].sizes(), ref.params[i].second.sizes()) << name << " " << got;
      const double diff = (values[i] - ref.params[i].second).abs().max().item<double>();
      EXPECT_LE(diff, 1e-10) << name << " " << got;
      worst_param = std::max(worst_param, diff);
    }
    std::printf("%s: %d steps equal one process (loss rel %.1e, norm rel %.1e, param abs %.1e)\n",
                name.c_str(), steps, worst_loss, worst_norm, worst_param);
  }
}

// args: which ("heads" | "no_plan").
FSDP2_SCENARIO(tp_parallelize_error) {
  auto o = Options();
  o.tensor_parallel_size = strategy::ParallelSize::Of(2);
  strategy::FSDP2Strategy s(o);
  s.setup_environment();
  if (args.at(0) == "heads") {
    s.connect(TestGPTModule(HeadsGPT(/*n_head=*/3)));
  } else {
    struct NoPlan : strategy::TrainingModule {
      std::shared_ptr<torch::nn::Module> module() override { return linear.ptr(); }
      at::Tensor training_step(const Batch& b, int64_t) override { return b[0]; }
      std::unique_ptr<torch::optim::Optimizer> configure_optimizers() override {
        return std::make_unique<torch::optim::AdamW>(linear->parameters());
      }
      torch::nn::Linear linear{4, 4};
    };
    s.connect(std::make_shared<NoPlan>());
  }
  s.parallelize();  // must throw
}

TEST(FSDP2StrategyTensorParallel, ParallelizeSaysWhatToChange) {
  for (const auto& [which, text] : std::vector<std::pair<std::string, std::string>>{
           {"heads", "tensor_parallel_size 2 does not divide n_head 3"},
           {"no_plan", "does not implement tp::TensorParallelPlanProvider"}}) {
    auto r = LaunchScenario("tp_parallelize_error", 2, {which}, std::chrono::seconds(60));
    ASSERT_FALSE(r.ok()) << which;
    EXPECT_NE(r.ranks[0].log.find(text), std::string::npos) << r.Describe();
  }
}

// setup_environment() in this process, as rank 0 of a pretend world: every
// size error is found before the rendezvous.
TEST(FSDP2StrategyTensorParallel, SizeErrorsAtSetup) {
  struct PretendWorld {
    explicit PretendWorld(int n) {
      setenv("RANK", "0", 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
    }
    ~PretendWorld() {
      unsetenv("RANK");
      unsetenv("WORLD_SIZE");
    }
  } world(4);
  auto expect = [](std::string dp, std::string tp, const std::string& text,
                   fsdp::ShardingStrategy st = fsdp::ShardingStrategy::kFullShard) {
    auto o = Options();
    o.data_parallel_size = strategy::ParallelSize::Parse(dp);
    o.tensor_parallel_size = strategy::ParallelSize::Parse(tp);
    o.sharding_strategy = st;
    o.shard_group_size = 2;
    strategy::FSDP2Strategy s(o);
    try {
      s.setup_environment();
      ADD_FAILURE() << "(" << dp << ", " << tp << ") was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect("2", "3", "(2) x tensor_parallel_size (3) = 6, but the job has 4 ranks");
  expect("auto", "3", "tensor_parallel_size 3 does not divide the world size 4");
  expect("3", "auto", "data_parallel_size 3 does not divide the world size 4");
  expect("1", "1", "make the product equal the world size");
  expect("auto", "2", "HYBRID_SHARD with tensor_parallel_size 2 is not supported",
         fsdp::ShardingStrategy::kHybridShard);
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
