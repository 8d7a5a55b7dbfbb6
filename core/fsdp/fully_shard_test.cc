// fully_shard's lifetime rules, in one process of one rank: a unit belongs to
// the module it was made of and to no module built later at that module's
// address, and the autograd nodes a unit attached do nothing once the unit
// is gone.
#include "core/fsdp/fully_shard.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <string>

#include "core/comm/device_mesh.h"
#include "core/comm/world.h"

namespace fsdp2 {
namespace fsdp {
namespace {

FSDPOptions SingleRankOptions() {
  static std::shared_ptr<comm::DeviceMesh> mesh = [] {
    comm::RendezvousOptions o;
    const char* tmp = std::getenv("TEST_TMPDIR");
    o.store_path = std::string(tmp ? tmp : "/tmp") + "/fully_shard_test_store_" +
                   std::to_string(getpid());
    return comm::DeviceMesh::Create(comm::World::Init(o), {1}, {"dp"});
  }();
  FSDPOptions options;
  options.mesh = mesh;
  return options;
}

// One Linear's worth of memory that modules are built in, one at a time, so
// that each lands where the previous one lived. The shared_ptr's control
// block is separate, so the memory is free for the next module as soon as
// the module dies, whoever still holds a weak_ptr.
alignas(torch::nn::LinearImpl) unsigned char g_slot[sizeof(torch::nn::LinearImpl)];

std::shared_ptr<torch::nn::LinearImpl> LinearInSlot() {
  auto* linear = new (g_slot) torch::nn::LinearImpl(torch::nn::LinearOptions(4, 3));
  return std::shared_ptr<torch::nn::LinearImpl>(
      linear, [](torch::nn::LinearImpl* m) { m->~LinearImpl(); });
}

TEST(UnitOf, ANewModuleAtADeadModulesAddressIsNotSharded) {
  auto first = LinearInSlot();
  fully_shard(first, SingleRankOptions());
  ASSERT_NE(unit_of(*first), nullptr);
  first.reset();  // dies; the registry still holds its entry

  auto second = LinearInSlot();
  ASSERT_EQ(static_cast<void*>(second.get()), static_cast<void*>(g_slot))
      << "the test needs the new module at the old one's address";
  EXPECT_EQ(unit_of(*second), nullptr);

  // fsdp::forward runs it as the plain module it is.
  const at::Tensor x = at::randn({2, 4});
  EXPECT_TRUE(at::equal(forward(second, x), second->forward(x)));

  // And it can be sharded in its own right.
  fully_shard(second, SingleRankOptions());
  EXPECT_NE(unit_of(*second), nullptr);
  second.reset();
}

TEST(UnitLifetime, BackwardAfterTheUnitIsGoneDoesNothing) {
  auto module = std::make_shared<torch::nn::LinearImpl>(4, 3);
  fully_shard(module, SingleRankOptions());
  const at::Tensor x = at::randn({2, 4}).requires_grad_();
  at::Tensor loss = forward(module, x).sum();
  const at::Tensor shard = module->named_parameters()["weight"];

  // The module dies with a graph still pointing at its unit; the next
  // registration drops the unit.
  std::weak_ptr<FSDPUnit> unit = unit_of(*module);
  module.reset();
  fully_shard(std::make_shared<torch::nn::LinearImpl>(2, 2), SingleRankOptions());
  ASSERT_TRUE(unit.expired());

  // Its pre-backward and post-backward do nothing: no gradient reaches the
  // shard, the input's gradient is still computed.
  loss.backward();
  EXPECT_FALSE(shard.grad().defined());
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().sizes(), x.sizes());
}

// clip_grad_norm_ takes a large gradient's norm in pieces: a weight of
// 180,000 elements (several pieces, the last one partial) clips exactly as
// LibTorch's clip_grad_norm_ clips the same gradients, for the 2-norm, a
// 3-norm and the infinity norm.
TEST(ClipGradNorm, LargeGradientsInPiecesEqualLibTorch) {
  for (double norm_type : {2.0, 3.0, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(norm_type);
    torch::manual_seed(11);
    auto plain = std::make_shared<torch::nn::LinearImpl>(torch::nn::LinearOptions(600, 300));
    plain->to(at::kDouble);
    auto sharded = std::make_shared<torch::nn::LinearImpl>(torch::nn::LinearOptions(600, 300));
    sharded->to(at::kDouble);
    {
      at::NoGradGuard no_grad;
      sharded->weight.copy_(plain->weight);
      sharded->bias.copy_(plain->bias);
    }
    fully_shard(sharded, SingleRankOptions());
    const at::Tensor x = at::randn({5, 600}, at::kDouble);
    plain->forward(x).pow(2).sum().backward();
    forward(sharded, x).pow(2).sum().backward();

    const double want =
        torch::nn::utils::clip_grad_norm_(plain->parameters(), /*max_norm=*/1.0, norm_type);
    const double got = clip_grad_norm_(*sharded, /*max_norm=*/1.0, norm_type);
    EXPECT_NEAR(got, want, 1e-12 * want);
    ASSERT_GT(want, 1.0) << "the test needs gradients that get clipped";
    for (const auto& item : sharded->named_parameters()) {
      const at::Tensor ref = plain->named_parameters()[item.key()].grad();
      EXPECT_TRUE(at::allclose(item.value().grad(), ref, 1e-12, 0)) << item.key();
    }
  }
}

}  // namespace
}  // namespace fsdp
}  // namespace fsdp2
