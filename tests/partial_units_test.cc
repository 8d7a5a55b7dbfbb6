// Units that run on only some ranks (issue #13): a fully_shard unit that one
// rank calls and another does not in the same step must neither hang nor mix
// buffers, and training must equal one process training the global batch.
//
// The model (Branchy) routes rows, so which units a rank calls depends on
// its rows: a mixture-of-experts block whose experts are units inside the
// block's unit (rank r's rows reach only two of experts 0..2 in each step,
// and expert 3 is never called anywhere), an early exit (rank 0's rows skip
// a block), a data-dependent branch (even ranks call unit a, odd ranks unit
// b), and a unit that runs on every rank but whose output reaches the loss
// on the last rank only. float64, N = 1..4, every sharding strategy:
// losses and final parameters equal one process's, every parameter has a
// gradient exactly where one process gives it one, and every rank issued
// the same collectives.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/comm/device_mesh.h"
#include "core/comm/world.h"
#include "core/fsdp/fully_shard.h"
#include "core/strategy/optimizer.h"
#include "tests/harness/multi_process.h"
#include "tests/training_util.h"

namespace fsdp2 {
namespace testing {
namespace {

constexpr int64_t kDim = 6;
constexpr int64_t kExperts = 4;  // expert 3 gets no rows anywhere
constexpr int64_t kClasses = 3;

struct ExpertImpl : torch::nn::Module {
  ExpertImpl() { fc = register_module("fc", torch::nn::Linear(kDim, kDim)); }
  at::Tensor forward(const at::Tensor& x) { return torch::tanh(fc->forward(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Expert);

// Rows `which` of `h` plus unit(h[which]); the unit is not called when no
// row is selected.
at::Tensor AddOnRows(Expert unit, const at::Tensor& h, const at::Tensor& which) {
  const at::Tensor idx = which.nonzero().reshape({-1});
  if (idx.numel() == 0) return h;
  return h.index_add(0, idx, fsdp::forward(unit, h.index_select(0, idx)));
}

// Top-1 mixture of experts: row i goes to expert route[i], scaled by the
// router's probability for it (so the router gets gradients).
struct MoEImpl : torch::nn::Module {
  MoEImpl() {
    router = register_module("router", torch::nn::Linear(kDim, kExperts));
    for (int64_t k = 0; k < kExperts; ++k) {
      experts.push_back(register_module("expert" + std::to_string(k), Expert()));
    }
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& route) {
    const at::Tensor gates = torch::softmax(router->forward(x), 1);
    at::Tensor out = x;
    for (int64_t k = 0; k < kExperts; ++k) {
      const at::Tensor idx = (route == k).nonzero().reshape({-1});
      if (idx.numel() == 0) continue;  // no rows for this expert here
      const at::Tensor y = fsdp::forward(experts[k], x.index_select(0, idx));
      const at::Tensor g = gates.index_select(0, idx).select(1, k).unsqueeze(1);
      out = out.index_add(0, idx, g * y);
    }
    return out;
  }
  torch::nn::Linear router{nullptr};
  std::vector<Expert> experts;
};
TORCH_MODULE(MoE);

// ctrl[i] = (expert, exits early, branch, uses the side unit).
struct BranchyImpl : torch::nn::Module {
  BranchyImpl() {
    inp = register_module("inp", torch::nn::Linear(kDim, kDim));
    moe = register_module("moe", MoE());
    late = register_module("late", Expert());
    branch_a = register_module("branch_a", Expert());
    branch_b = register_module("branch_b", Expert());
    side = register_module("side", Expert());
    head = register_module("head", torch::nn::Linear(kDim, kClasses));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& ctrl) {
    at::Tensor h = torch::tanh(inp->forward(x));
    h = fsdp::forward(moe, h, ctrl.select(1, 0).contiguous());
    h = AddOnRows(late, h, ctrl.select(1, 1) == 0);  // the rows that go on
    h = AddOnRows(branch_a, h, ctrl.select(1, 2) == 0);
    h = AddOnRows(branch_b, h, ctrl.select(1, 2) == 1);
    const at::Tensor s = fsdp::forward(side, h);  // every row, every rank
    const at::Tensor use = ctrl.select(1, 3).nonzero().reshape({-1});
    if (use.numel() > 0) h = h.index_add(0, use, s.index_select(0, use));
    return head->forward(h);
  }
  torch::nn::Linear inp{nullptr}, head{nullptr};
  MoE moe{nullptr};
  Expert late{nullptr}, branch_a{nullptr}, branch_b{nullptr}, side{nullptr};
};
TORCH_MODULE(Branchy);

struct Spec {
  std::string strategy = "full_shard";
  int steps = 4;
  int64_t batch_per_rank = 2;
  int grad_accum = 1;
  bool lists = false;  // explicit prefetch lists across skipped units

  std::vector<std::string> ToArgs() const {
    return {strategy, std::to_string(steps), std::to_string(batch_per_rank),
            std::to_string(grad_accum), lists ? "lists" : "-"};
  }
  static Spec FromArgs(const std::vector<std::string>& a) {
    Spec s;
    s.strategy = a.at(0);
    s.steps = std::stoi(a.at(1));
    s.batch_per_rank = std::stoll(a.at(2));
    s.grad_accum = std::stoi(a.at(3));
    s.lists = a.at(4) == "lists";
    return s;
  }
  std::string Name() const {
    return "branchy/" + strategy + (grad_accum > 1 ? "/accum=" + std::to_string(grad_accum) : "") +
           (lists ? "/lists" : "");
  }
};

// Step `step`'s global batch for `world` ranks: inputs, targets, and each
// row's routing, a function of the rank and micro-batch that the row
// belongs to (see training_util.h for the row layout).
struct Batch {
  at::Tensor x, y, ctrl;
};
Batch GlobalBatch(const Spec& spec, int step, int world) {
  const int64_t B = spec.batch_per_rank;
  const int64_t rows = world * B * spec.grad_accum;
  auto gen = at::detail::createCPUGenerator(1234 + step);
  Batch b;
  b.x = at::randn({rows, kDim}, gen, at::TensorOptions().dtype(at::kDouble));
  b.y = at::randint(kClasses, {rows}, gen, at::TensorOptions().dtype(at::kLong));
  b.ctrl = at::zeros({rows, 4}, at::kLong);
  auto c = b.ctrl.accessor<int64_t, 2>();
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t chunk = i / B, rank = chunk % world, micro = chunk / world;
    // Two of experts 0..2 per rank and micro-batch, changing with both.
    c[i][0] = (rank + micro + step + i % B) % 3;
    c[i][1] = rank == 0 ? 1 : i % 2;  // rank 0's rows all exit early
    c[i][2] = rank % 2;
    c[i][3] = rank == world - 1 ? 1 : 0;
  }
  return b;
}

// The units, bottom-up (experts, the block, the rest, the root last).
std::vector<std::shared_ptr<torch::nn::Module>> Units(const Branchy& m) {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (const auto& e : m->moe->experts) units.push_back(e.ptr());
  units.push_back(m->moe.ptr());
  for (const auto& u : {m->late, m->branch_a, m->branch_b, m->side}) {
    units.push_back(u.ptr());
  }
  units.push_back(m.ptr());
  return units;
}

Branchy Build() {
  torch::manual_seed(5);
  Branchy m;
  m->to(at::kDouble);
  return m;
}

at::Tensor Loss(Branchy& m, const at::Tensor& x, const at::Tensor& ctrl,
                const at::Tensor& y) {
  return torch::nn::functional::cross_entropy(fsdp::forward(m, x, ctrl), y);
}

// The names of the parameters whose .grad is defined, space-separated.
std::string GradDefined(torch::nn::Module& m) {
  std::ostringstream s;
  for (const auto& p : m.named_parameters()) {
    if (p.value().grad().defined()) s << p.key() << " ";
  }
  return s.str();
}

struct Result {
  TrainOutput out;
  std::string grad_defined;
};

Result TrainReference(const Spec& spec, int world) {
  Branchy m = Build();
  auto opt = strategy::MakeOptimizer(m->parameters(), TestOptimizer("adamw"));
  Result r;
  for (int step = 0; step < spec.steps; ++step) {
    Batch b = GlobalBatch(spec, step, world);
    opt->zero_grad(/*set_to_none=*/false);
    at::Tensor loss = Loss(m, b.x, b.ctrl, b.y);
    loss.backward();
    opt->step();
    r.out.losses.push_back(loss.item<double>());
  }
  for (const auto& p : m->named_parameters()) {
    r.out.params.emplace_back(p.key(), p.value().detach().clone());
  }
  r.grad_defined = GradDefined(*m);
  return r;
}

FSDP2_SCENARIO(branchy) {
  const Spec spec = Spec::FromArgs(args);
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  const int n = world->size(), rank = world->rank();
  Branchy m = Build();
  fsdp::FSDPOptions options;
  if (spec.strategy == "hybrid_shard") {
    const int replicate = (n % 2 == 0 && n > 2) ? 2 : 1;
    options.mesh = comm::DeviceMesh::Create(world, {replicate, n / replicate},
                                            {"replicate", "shard"});
  } else {
    options = DataParallelOptions(world);
  }
  options.strategy = fsdp::ParseShardingStrategy(spec.strategy);
  const auto units = Units(m);
  for (const auto& unit : units) fsdp::fully_shard(unit, options);
  if (spec.lists) {
    // Lists that jump over units some ranks skip (expert0, late, branch_a
    // run on some ranks only; expert3 and branch_b on none), from a unit
    // that is itself skipped on some ranks, and the root's backward list
    // (it is unsharded when backward begins).
    const auto& e = m->moe->experts;
    fsdp::set_modules_to_forward_prefetch(*e[0], {e[2].ptr(), m->late.ptr(), m->side.ptr()});
    fsdp::set_modules_to_forward_prefetch(*m->moe, {e[1].ptr()});
    fsdp::set_modules_to_forward_prefetch(*m->late, {m->branch_b.ptr()});
    fsdp::set_modules_to_backward_prefetch(*m, {m->side.ptr(), m->late.ptr()});
    fsdp::set_modules_to_backward_prefetch(*m->branch_a, {e[3].ptr(), e[0].ptr()});
    fsdp::set_modules_to_backward_prefetch(*m->moe, {e[1].ptr()});
  }
  auto opt = strategy::MakeOptimizer(m->parameters(), TestOptimizer("adamw"));

  TrainOutput out;
  const int64_t B = spec.batch_per_rank;
  for (int step = 0; step < spec.steps; ++step) {
    Batch b = GlobalBatch(spec, step, n);
    opt->zero_grad(/*set_to_none=*/false);
    double local_loss = 0;
    for (int micro = 0; micro < spec.grad_accum; ++micro) {
      fsdp::set_requires_gradient_sync(*m, micro == spec.grad_accum - 1);
      const int64_t start = (int64_t{micro} * n + rank) * B;
      at::Tensor loss = Loss(m, b.x.narrow(0, start, B), b.ctrl.narrow(0, start, B),
                             b.y.narrow(0, start, B)) /
                        spec.grad_accum;
      loss.backward();
      local_loss += loss.item<double>();
    }
    opt->step();
    at::Tensor global = at::full({1}, local_loss, at::kDouble);
    world->group()->all_reduce(global).wait();
    out.losses.push_back(global.item<double>() / n);
  }
  for (const auto& unit : units) {
    const fsdp::CommWaitStats comm = fsdp::comm_wait_stats(*unit);
    out.all_gathers.push_back(comm.all_gathers);
    out.reductions.push_back(comm.reductions);
  }
  out.stats = fsdp::memory_stats(*m);
  const std::string grads = GradDefined(*m);  // before gathering anything
  out.params = fsdp::full_state_dict(*m);
  const std::string dir = WorkerOutDir() + "/rank" + std::to_string(rank);
  WriteOutput(dir + ".txt", out);
  std::ofstream(dir + ".grads") << grads;
}

// Runs `spec` on N = `worlds` ranks and compares every rank with one process.
void ExpectEquivalent(const Spec& spec, std::vector<int> worlds = {1, 2, 3, 4}) {
  for (int n : worlds) {
    const Result ref = TrainReference(spec, n);
    LaunchResult r = LaunchScenario("branchy", n, spec.ToArgs(), std::chrono::seconds(120));
    ASSERT_TRUE(r.ok()) << spec.Name() << " N=" << n << ":\n" << r.Describe();
    std::vector<TrainOutput> outs;
    for (int rank = 0; rank < n; ++rank) {
      const std::string base = r.out_dir + "/rank" + std::to_string(rank);
      outs.push_back(ReadOutput(base + ".txt"));
      const TrainOutput& out = outs.back();
      const double loss_diff = MaxLossRelDiff(out, ref.out, 1e-12);
      const double param_diff = MaxParamRelDiff(out, ref.out, 1e-3);
      if (rank == 0) {
        std::printf("%-32s N=%d  loss rel diff %.3g  param rel diff %.3g  "
                    "final loss %.6f\n", spec.Name().c_str(), n, loss_diff,
                    param_diff, ref.out.losses.back());
      }
      EXPECT_LE(loss_diff, 1e-12) << spec.Name() << " N=" << n << " rank " << rank;
      EXPECT_LE(param_diff, 1e-12) << spec.Name() << " N=" << n << " rank " << rank;
      // A gradient where one process has one, and none where it has none
      // (expert3 on every N; late and branch_b where no rank calls them).
      EXPECT_EQ(ReadFile(base + ".grads"), ref.grad_defined)
          << spec.Name() << " N=" << n << " rank " << rank;
      EXPECT_NE(ref.grad_defined.find("moe.expert0.fc.weight"), std::string::npos);
      EXPECT_EQ(ref.grad_defined.find("moe.expert3."), std::string::npos);
      // Every rank issued the same all-gathers and reductions per unit.
      EXPECT_EQ(out.all_gathers, outs[0].all_gathers) << spec.Name() << " N=" << n;
      EXPECT_EQ(out.reductions, outs[0].reductions) << spec.Name() << " N=" << n;
      EXPECT_EQ(out.stats.unsharded_param_bytes, 0) << spec.Name() << " N=" << n;
    }
  }
}

class Strategies : public ::testing::TestWithParam<std::string> {};

TEST_P(Strategies, RoutedUnitsMatchOneProcess) {
  Spec spec;
  spec.strategy = GetParam();
  ExpectEquivalent(spec);
}

// Two micro-batches: an expert may run in one and not the other, on some
// ranks; what it got in either is reduced once, in the synced backward.
TEST_P(Strategies, GradientAccumulationOverRoutedMicroBatches) {
  Spec spec;
  spec.strategy = GetParam();
  spec.grad_accum = 2;
  spec.steps = 3;
  ExpectEquivalent(spec, {1, 2, 4});
}

// Explicit prefetch lists that reach past units some ranks skip: every rank
// still issues the same collectives (a skipped unit issues its list as the
// ranks that run it do), and training equals one process.
TEST_P(Strategies, ExplicitPrefetchListsOverSkippedUnits) {
  Spec spec;
  spec.strategy = GetParam();
  spec.lists = true;
  spec.grad_accum = 2;
  spec.steps = 3;
  ExpectEquivalent(spec, {2, 3, 4});
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, Strategies,
                         ::testing::Values("full_shard", "shard_grad_op",
                                           "no_shard", "hybrid_shard"));

// A regular model (every rank calls every unit, in tree order) pays nothing
// for the canonical order: per step, one all-gather per unit in forward and
// one more in backward for each unit resharded after forward (not the
// root), one reduction per unit.
FSDP2_SCENARIO(regular) {
  TrainSpec spec;
  spec.steps = 3;
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  WriteOutput(WorkerOutDir() + "/rank" + std::to_string(world->rank()) + ".txt",
              TrainSharded(spec, world));
}

TEST(RegularModel, NoExtraCollectives) {
  LaunchResult r = LaunchScenario("regular", 2, {}, std::chrono::seconds(120));
  ASSERT_TRUE(r.ok()) << r.Describe();
  for (int rank = 0; rank < 2; ++rank) {
    TrainOutput out = ReadOutput(r.out_dir + "/rank" + std::to_string(rank) + ".txt");
    ASSERT_GE(out.all_gathers.size(), 2u);
    const size_t root = out.all_gathers.size() - 1;  // the inner units, then the root
    for (size_t u = 0; u < out.all_gathers.size(); ++u) {
      EXPECT_EQ(out.all_gathers[u], u == root ? 3 : 6) << "unit " << u;
      EXPECT_EQ(out.reductions[u], 3) << "unit " << u;
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
