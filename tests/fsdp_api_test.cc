// fully_shard's contract outside training equivalence: what named_parameters
// shows, state-dict round trips, gradient sync switching, and the errors.
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <functional>

#include "core/comm/world.h"
#include "core/fsdp/fully_shard.h"
#include "core/models/gpt.h"
#include "core/models/mlp.h"
#include "tests/harness/multi_process.h"
#include "tests/training_util.h"

namespace fsdp2 {
namespace testing {
namespace {

std::shared_ptr<comm::DeviceMesh> SingleRankMesh() {
  static std::shared_ptr<comm::DeviceMesh> mesh = [] {
    comm::RendezvousOptions o;
    const char* tmp = std::getenv("TEST_TMPDIR");
    o.store_path = std::string(tmp ? tmp : "/tmp") + "/api_test_store_" +
                   std::to_string(getpid());
    return comm::DeviceMesh::Create(comm::World::Init(o), {1}, {"dp"});
  }();
  return mesh;
}

fsdp::FSDPOptions Options(std::shared_ptr<comm::DeviceMesh> mesh) {
  fsdp::FSDPOptions o;
  o.mesh = std::move(mesh);
  return o;
}

TEST(FullyShard, TwiceOnOneModuleIsAnError) {
  torch::nn::Linear linear(4, 4);
  fsdp::fully_shard(linear, Options(SingleRankMesh()));
  try {
    fsdp::fully_shard(linear, Options(SingleRankMesh()));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("already sharded"), std::string::npos);
  }
}

TEST(FullyShard, MixedDtypesAreAnError) {
  torch::nn::Sequential seq(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4));
  seq[1]->to(at::kDouble);
  try {
    fsdp::fully_shard(seq.ptr(), Options(SingleRankMesh()));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("different dtypes"), std::string::npos)
        << e.what();
  }
}

TEST(FullyShard, NullMeshIsAnError) {
  torch::nn::Linear linear(4, 4);
  EXPECT_THROW(fsdp::fully_shard(linear, fsdp::FSDPOptions{}),
               std::invalid_argument);
}

TEST(FullyShard, HybridNeedsATwoDimensionalMesh) {
  torch::nn::Linear linear(4, 4);
  auto o = Options(SingleRankMesh());
  o.strategy = fsdp::ShardingStrategy::kHybridShard;
  try {
    fsdp::fully_shard(linear, o);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("2-D mesh"), std::string::npos);
  }
}

struct Holder : torch::nn::Module {
  at::Tensor w;
};

struct TwoUsers : torch::nn::Module {
  TwoUsers() {
    a = register_module("a", torch::nn::Linear(4, 4));
    b = register_module("b", std::make_shared<Holder>());
    b->w = b->register_parameter("w", a->weight);  // tied to a.weight
  }
  torch::nn::Linear a{nullptr};
  std::shared_ptr<Holder> b;
};

TEST(FullyShard, ParameterTiedAcrossUnitsIsAnError) {
  auto m = std::make_shared<TwoUsers>();
  fsdp::fully_shard(m->a, Options(SingleRankMesh()));
  try {
    fsdp::fully_shard(m, Options(SingleRankMesh()));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tied"), std::string::npos) << e.what();
  }
}

TEST(FullyShard, ModuleWithoutParametersIsAllowed) {
  torch::nn::Sequential seq(torch::nn::Linear(4, 4));
  torch::nn::ReLU relu;
  auto mesh = SingleRankMesh();
  EXPECT_NO_THROW(fsdp::fully_shard(relu, Options(mesh)));
  fsdp::fully_shard(seq.ptr(), Options(mesh));
  at::Tensor y = fsdp::forward(relu, fsdp::forward(seq, at::randn({2, 4})));
  y.sum().backward();
  EXPECT_TRUE(seq->parameters()[0].grad().defined());
}

TEST(FullyShard, ParseShardingStrategy) {
  EXPECT_EQ(fsdp::ParseShardingStrategy("FULL_SHARD"),
            fsdp::ShardingStrategy::kFullShard);
  EXPECT_EQ(fsdp::ParseShardingStrategy("shard-grad-op"),
            fsdp::ShardingStrategy::kShardGradOp);
  EXPECT_THROW(fsdp::ParseShardingStrategy("zero3"), std::invalid_argument);
}

// On N ranks: names stay, values are dim-0 shards (empty where a parameter
// has fewer rows than ranks), the full state dict round-trips, and turning
// gradient sync off keeps gradients local until it is turned on again.
FSDP2_SCENARIO(shard_layout) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  const int n = world->size(), r = world->rank();
  torch::manual_seed(3);
  models::MLPConfig config;
  config.out_features = 3;
  auto mlp = models::MLP(config);
  auto full_before = mlp->named_parameters();
  std::vector<std::pair<std::string, at::Tensor>> reference;
  for (const auto& p : full_before) reference.emplace_back(p.key(), p.value().detach().clone());

  const fsdp::FSDPOptions o = DataParallelOptions(world);
  for (size_t i = 0; i < mlp->blocks->size(); ++i) fsdp::fully_shard(mlp->block(i), o);
  fsdp::fully_shard(mlp, o);

  auto sharded = mlp->named_parameters();
  Check(sharded.keys() == full_before.keys(), "parameter names unchanged");
  for (const auto& [name, full] : reference) {
    const at::Tensor& s = sharded[name];
    const int64_t rows = full.size(0), per = (rows + n - 1) / n;
    const int64_t start = std::min(r * per, rows);
    const int64_t local = std::min(per, rows - start);
    Check(s.size(0) == local, name + " has " + std::to_string(s.size(0)) +
                                  " rows, expected " + std::to_string(local));
    Check(s.equal(full.narrow(0, start, local)), name + " holds its rows");
  }
  if (n == 4 && r == 3) {
    Check(sharded["output.weight"].size(0) == 0, "3 rows on 4 ranks: last empty");
  }

  auto state = fsdp::full_state_dict(*mlp);
  for (size_t i = 0; i < state.size(); ++i) {
    Check(state[i].second.equal(reference[i].second), "full_state_dict value");
  }
  for (auto& [name, value] : state) value = value * 2 + 1;
  fsdp::load_full_state_dict(*mlp, state);
  auto again = fsdp::full_state_dict(*mlp);
  for (size_t i = 0; i < state.size(); ++i) {
    Check(again[i].second.equal(state[i].second), "load_full_state_dict");
  }
  auto bad = state;
  bad[0].second = at::zeros({1});
  ExpectThrows<std::invalid_argument>("shape mismatch rejected", "shape",
                                      [&] { fsdp::load_full_state_dict(*mlp, bad); });
  bad = state;
  bad.pop_back();
  ExpectThrows<std::invalid_argument>("missing key rejected", "missing key",
                                      [&] { fsdp::load_full_state_dict(*mlp, bad); });

  // No sync: local unsharded accumulation, no shard gradients.
  fsdp::set_requires_gradient_sync(*mlp, false);
  fsdp::forward(mlp, at::randn({2, 16})).sum().backward();
  auto stats = fsdp::memory_stats(*mlp);
  Check(stats.sharded_grad_bytes == 0, "no shard grads without sync");
  Check(stats.unsharded_grad_bytes > 0, "local accumulation kept");
  fsdp::set_requires_gradient_sync(*mlp, true);
  fsdp::forward(mlp, at::randn({2, 16})).sum().backward();
  stats = fsdp::memory_stats(*mlp);
  Check(stats.unsharded_grad_bytes == 0, "accumulation reduced");
  Check(stats.sharded_grad_bytes == stats.sharded_param_bytes, "shard grads");
  Check(stats.unsharded_param_bytes == 0, "resharded after backward");
}

TEST(FullyShard, ShardLayoutAndStateDictOnManyRanks) {
  for (int n : {1, 2, 3, 4}) {
    auto r = LaunchScenario("shard_layout", n, {}, std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << "world " << n << "\n" << r.Describe();
  }
}

// Steady-state training takes no unit-sized buffer from the system: from
// the second step on, every unsharded buffer and reduction buffer is one
// the engine's pool kept from the step before, and none stays in use
// between steps. args: strategy, then "ac" to checkpoint every block: then
// each block's recomputation borrows an idle kept buffer too (one lend per
// block and step where one is idle), and that changes none of the above.
FSDP2_SCENARIO(steady_state_buffers) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  torch::manual_seed(5);
  models::GPTConfig config = TinyGPT();
  config.n_embd = 256;  // a block's buffers are a few MiB: pooled sizes
  config.n_head = 4;
  config.n_layer = 2;
  models::GPT gpt(config);
  fsdp::FSDPOptions o = DataParallelOptions(world);
  o.strategy = fsdp::ParseShardingStrategy(args.at(0));
  for (size_t i = 0; i < gpt->blocks->size(); ++i) fsdp::fully_shard(gpt->block(i), o);
  fsdp::fully_shard(gpt, o);
  const bool ac = args.size() > 1 && args.at(1) == "ac";
  if (ac) fsdp::apply_activation_checkpointing(*gpt, fsdp::ActivationCheckpointing::Full());
  torch::optim::AdamW opt(gpt->parameters(), torch::optim::AdamWOptions(1e-3));
  const auto tokens = TokenWindows(config.vocab_size, 2);
  // The first step runs without forward prefetch (no order known yet), so
  // the second may hold one more buffer at once; from then on, none is new.
  fsdp::BufferPoolStats after_second;
  for (int step = 0; step < 5; ++step) {
    const int64_t lent_before = fsdp::buffer_pool_stats().lent;
    opt.zero_grad(/*set_to_none=*/false);
    models::LanguageModelLoss(fsdp::forward(gpt, tokens[0]), tokens[1]).backward();
    opt.step();
    const auto stats = fsdp::buffer_pool_stats();
    Check(stats.in_use_bytes == 0, "step " + std::to_string(step) + ": " +
                                       std::to_string(stats.in_use_bytes) +
                                       " pooled bytes still in use between steps");
    const int64_t lent = stats.lent - lent_before;
    // Under SHARD_GRAD_OP every unit still holds its parameters from
    // forward when backward begins: the first block to recompute finds no
    // idle buffer, and its activations go to the process allocator.
    const int64_t blocks = static_cast<int64_t>(gpt->blocks->size());
    const int64_t want_lent = !ac ? 0 : args.at(0) == "shard_grad_op" ? blocks - 1 : blocks;
    if (step > 0) {
      Check(lent == want_lent, "step " + std::to_string(step) + " lent " + std::to_string(lent) +
                                   " buffers to recomputations, expected " +
                                   std::to_string(want_lent));
    }
    if (step == 0) {
      Check(stats.allocations > 0, "the first step takes its buffers from the system");
    } else if (step == 1) {
      after_second = stats;
    } else {
      Check(stats.allocations == after_second.allocations,
            "step " + std::to_string(step) + " allocated " +
                std::to_string(stats.allocations - after_second.allocations) +
                " unit-sized buffers anew");
      Check(stats.reuses > after_second.reuses, "buffers are reused");
    }
  }
  fsdp::release_buffer_pool();
  Check(fsdp::buffer_pool_stats().kept_bytes == 0, "release_buffer_pool frees what it kept");
}

TEST(FullyShard, SteadyStateTrainingAllocatesNoUnitBuffers) {
  for (const char* strategy : {"full_shard", "shard_grad_op", "no_shard"}) {
    auto r = LaunchScenario("steady_state_buffers", 2, {strategy}, std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << strategy << "\n" << r.Describe();
  }
  for (const char* strategy : {"full_shard", "shard_grad_op"}) {
    auto r = LaunchScenario("steady_state_buffers", 2, {strategy, "ac"}, std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << strategy << " with activation checkpointing\n" << r.Describe();
  }
}

TEST(FullyShard, BadControlsAreErrors) {
  auto o = Options(SingleRankMesh());
  o.forward_prefetch = -1;
  torch::nn::Linear a(4, 4);
  try {
    fsdp::fully_shard(a, o);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("forward_prefetch -1"), std::string::npos)
        << e.what();
  }
  o = Options(SingleRankMesh());
  o.backward_prefetch = -2;
  EXPECT_THROW(fsdp::fully_shard(a, o), std::invalid_argument);
  for (double factor : {0.0, -1.0, std::nan("")}) {
    o = Options(SingleRankMesh());
    o.gradient_divide_factor = factor;
    try {
      fsdp::fully_shard(a, o);
      FAIL() << "expected std::invalid_argument for " << factor;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("gradient_divide_factor"), std::string::npos)
          << e.what();
    }
  }
  o = Options(SingleRankMesh());
  o.reshard_after_forward_size = 2;
  try {
    fsdp::fully_shard(a, o);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("reshard_after_forward_size 2 must be 0 or divide the "
                                         "shard group size 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fsdp::unit_of(*a)) << "a refused module stays unsharded";
  fsdp::fully_shard(a, Options(SingleRankMesh()));
  EXPECT_THROW(fsdp::set_gradient_divide_factor(*a, 0), std::invalid_argument);
  torch::nn::Linear plain(4, 4);
  EXPECT_THROW(fsdp::unshard(*plain), std::invalid_argument);
  EXPECT_THROW(fsdp::reshard(*plain), std::invalid_argument);
}

TEST(FullyShard, IgnoredParametersStayWholeAndUnreduced) {
  torch::nn::Sequential seq(torch::nn::Linear(4, 6), torch::nn::Linear(6, 2));
  auto o = Options(SingleRankMesh());
  const at::Tensor ignored = seq[1]->named_parameters()["weight"];
  o.ignored_params = {ignored, at::zeros({3})};  // a stranger is passed over
  o.mp_policy.param_dtype = at::kDouble;  // a cast the ignored one escapes
  seq->to(at::kDouble);
  fsdp::fully_shard(seq.ptr(), o);
  const auto stats = fsdp::memory_stats(*seq);
  EXPECT_EQ(stats.total_param_numel, 4 * 6 + 6 + 2) << "the ignored weight is not FSDP's";
  EXPECT_TRUE(seq->named_parameters()["1.weight"].is_same(ignored));
  fsdp::forward(seq, at::randn({3, 4}, at::kDouble)).sum().backward();
  EXPECT_TRUE(ignored.grad().defined());
  EXPECT_EQ(ignored.grad().sizes(), ignored.sizes());
}

// Explicit prefetch lists: what set_modules_to_*_prefetch refuses at once,
// and what check_prefetch_lists() (and the root's first forward) refuses:
// a unit of another root, a unit the pass reaches first.
TEST(FullyShard, PrefetchListsAreChecked) {
  auto build = [] {
    models::GPT gpt(TinyGPT());
    auto o = Options(SingleRankMesh());
    for (size_t i = 0; i < gpt->blocks->size(); ++i) fsdp::fully_shard(gpt->block(i), o);
    fsdp::fully_shard(gpt, o);
    return gpt;
  };
  auto expect_invalid = [](const std::function<void()>& call, const std::string& text) {
    try {
      call();
      FAIL() << "expected std::invalid_argument containing '" << text << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  models::GPT gpt = build(), other = build();
  const std::shared_ptr<torch::nn::Module> b0 = gpt->block(0).ptr(), b1 = gpt->block(1).ptr();
  torch::nn::Linear plain(4, 4);
  expect_invalid([&] { fsdp::set_modules_to_forward_prefetch(*plain, {b0}); }, "not sharded");
  expect_invalid([&] { fsdp::set_modules_to_forward_prefetch(*b0, {plain.ptr()}); },
                 "not sharded");
  expect_invalid([&] { fsdp::set_modules_to_backward_prefetch(*b0, {b0}); }, "lists itself");
  expect_invalid([&] { fsdp::set_modules_to_forward_prefetch(*gpt, {b1, b1}); },
                 "listed twice");

  fsdp::set_modules_to_forward_prefetch(*b0, {other->block(1).ptr()});
  expect_invalid([&] { fsdp::check_prefetch_lists(*gpt); }, "a unit of another root");
  fsdp::set_modules_to_forward_prefetch(*b0, {});
  fsdp::set_modules_to_forward_prefetch(*b1, {b0});
  expect_invalid([&] { fsdp::check_prefetch_lists(*gpt); },
                 "the forward prefetch list of 'blocks.1' names 'blocks.0', which the "
                 "forward reaches before it");
  const auto tokens = TokenWindows(TinyGPT().vocab_size, 2);
  expect_invalid([&] { fsdp::forward(gpt, tokens[0]); }, "reaches before it");
  fsdp::set_modules_to_forward_prefetch(*b1, {});
  fsdp::set_modules_to_backward_prefetch(*b0, {b1});
  expect_invalid([&] { fsdp::check_prefetch_lists(*gpt); },
                 "the backward prefetch list of 'blocks.0' names 'blocks.1'");
  // Valid lists: the root's, forward and backward (unsharded at backward).
  fsdp::set_modules_to_backward_prefetch(*b0, {});
  fsdp::set_modules_to_forward_prefetch(*gpt, {b1, b0});
  fsdp::set_modules_to_backward_prefetch(*gpt, {b0, b1});
  fsdp::check_prefetch_lists(*gpt);
  models::LanguageModelLoss(fsdp::forward(gpt, tokens[0]), tokens[1]).backward();
  EXPECT_EQ(fsdp::memory_stats(*gpt).unsharded_param_bytes, 0);
  EXPECT_TRUE(b0->named_parameters()["fc.weight"].grad().defined());
}

// Explicit unshard()/reshard() on 2 ranks: an async all-gather makes a
// block whole before its forward, which then reshards it as its options
// say; a step with them equals one without, bit for bit. args: strategy.
FSDP2_SCENARIO(explicit_unshard) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  auto build = [&] {
    torch::manual_seed(11);
    models::GPT gpt(TinyGPT());
    gpt->to(at::kDouble);
    fsdp::FSDPOptions o = DataParallelOptions(world);
    o.strategy = fsdp::ParseShardingStrategy(args.at(0));
    for (size_t i = 0; i < gpt->blocks->size(); ++i) fsdp::fully_shard(gpt->block(i), o);
    fsdp::fully_shard(gpt, o);
    return gpt;
  };
  const auto tokens = TokenWindows(TinyGPT().vocab_size, 4);
  auto plain = build();
  models::LanguageModelLoss(fsdp::forward(plain, tokens[0]), tokens[1]).backward();
  fsdp::reshard(*plain);

  auto gpt = build();
  const auto block = gpt->block(1);
  const int64_t n_embd = TinyGPT().n_embd;
  Check(block->fc->weight.numel() == 0, "a block is sharded before its forward");
  fsdp::UnshardHandle handle = fsdp::unshard(*block, /*async_op=*/true);
  handle.wait();
  handle.wait();  // once is enough; again is a no-op
  Check(block->fc->weight.size(0) == 4 * n_embd && block->fc->weight.size(1) == n_embd,
        "unshard() gathers the whole weight");
  Check(fsdp::memory_stats(*gpt).unsharded_param_bytes > 0, "unsharded bytes counted");
  fsdp::reshard(*block);
  Check(fsdp::memory_stats(*gpt).unsharded_param_bytes == 0, "reshard() frees them");
  fsdp::unshard(*block);  // synchronous, before the forward
  models::LanguageModelLoss(fsdp::forward(gpt, tokens[0]), tokens[1]).backward();
  Check(fsdp::memory_stats(*gpt).unsharded_param_bytes == 0,
        "resharded after backward as usual");
  const auto a = plain->named_parameters(), b = gpt->named_parameters();
  for (const auto& item : a) {
    Check(item.value().grad().equal(b[item.key()].grad()),
          item.key() + ": the same gradient with explicit unshard");
  }
}

TEST(FullyShard, ExplicitUnshardAndReshard) {
  for (const char* strategy : {"full_shard", "shard_grad_op"}) {
    auto r = LaunchScenario("explicit_unshard", 2, {strategy}, std::chrono::seconds(120));
    EXPECT_TRUE(r.ok()) << strategy << "\n" << r.Describe();
  }
}

// Reduce-scatter per micro-batch with the all-reduce held back (HYBRID_SHARD,
// 2 replicas x 2 shards): no unsharded gradient outlives its backward, the
// held-back sum counts as sharded gradient bytes, and the shards' .grad
// appear only with the all-reduce.
FSDP2_SCENARIO(held_back_all_reduce) {
  auto world = comm::World::Init(comm::RendezvousOptions::FromEnv());
  torch::manual_seed(3);
  models::MLP mlp(models::MLPConfig{});
  fsdp::FSDPOptions o;
  o.mesh = comm::DeviceMesh::Create(world, {2, 2}, {"replicate", "shard"});
  o.strategy = fsdp::ShardingStrategy::kHybridShard;
  for (size_t i = 0; i < mlp->blocks->size(); ++i) fsdp::fully_shard(mlp->block(i), o);
  fsdp::fully_shard(mlp, o);
  fsdp::set_requires_all_reduce(*mlp, false);
  for (int micro = 0; micro < 2; ++micro) {
    fsdp::forward(mlp, at::randn({2, 16})).sum().backward();
    const auto stats = fsdp::memory_stats(*mlp);
    Check(stats.unsharded_grad_bytes == 0, "unsharded gradients freed at once");
    // Its padding and one contribution flag per parameter: under 4 KiB.
    Check(stats.sharded_grad_bytes >= stats.sharded_param_bytes &&
              stats.sharded_grad_bytes <= stats.sharded_param_bytes + 4096,
          "the held-back sum is one sharded gradient: " +
              std::to_string(stats.sharded_grad_bytes) + " bytes for " +
              std::to_string(stats.sharded_param_bytes) + " of parameters");
    for (const auto& p : mlp->parameters()) {
      Check(!p.grad().defined(), "no .grad before the all-reduce");
    }
  }
  fsdp::set_requires_all_reduce(*mlp, true);
  fsdp::forward(mlp, at::randn({2, 16})).sum().backward();
  const auto stats = fsdp::memory_stats(*mlp);
  Check(stats.sharded_grad_bytes == stats.sharded_param_bytes,
        "the sum went to the shards' .grad");
}

TEST(FullyShard, HeldBackAllReduceKeepsOnlyShardedGradients) {
  auto r = LaunchScenario("held_back_all_reduce", 4, {}, std::chrono::seconds(120));
  EXPECT_TRUE(r.ok()) << r.Describe();
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
