// FSDPParam's layout arithmetic and its views and copies, without ranks:
// every rank's view is computed in this one process, and an all-gather or a
// reduce-scatter is played by copying every rank's part into one buffer.
#include "core/fsdp/internal/fsdp_param.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/fsdp/internal/fsdp_collectives.h"

namespace fsdp2 {
namespace fsdp {
namespace {

const at::TensorOptions kFloat = at::TensorOptions().dtype(at::kFloat);

// The parameters rank `rank` of `world` makes of `fulls`, laid out one after
// another in the flat shard as FSDPParamGroup lays them out, and sharded.
std::vector<FSDPParam> Shard(const std::vector<at::Tensor>& fulls, int world,
                             int rank) {
  std::vector<FSDPParam> params;
  int64_t offset = 0;
  for (size_t i = 0; i < fulls.size(); ++i) {
    params.emplace_back("p" + std::to_string(i), fulls[i].clone());
    params.back().init_layout(world, rank, offset);
    offset += params.back().shard_numel();
    params.back().init_shard(kFloat);
  }
  return params;
}

int64_t FlatNumel(const std::vector<FSDPParam>& params) {
  return params.empty() ? 0
                        : params.back().flat_offset() + params.back().shard_numel();
}

// Shapes that exercise every corner: uneven rows, fewer rows than ranks, a
// 0-d parameter, no rows, rows of no elements, a 3-d parameter.
std::vector<at::Tensor> Corners() {
  return {at::randn({5, 3}), at::randn({2, 4}), at::randn({}),
          at::randn({0, 5}), at::randn({7}),    at::randn({3, 0}),
          at::randn({1, 2, 2})};
}

FSDPParam LaidOut(std::vector<int64_t> shape, int world, int rank,
                  int64_t offset = 0) {
  FSDPParam p("p", at::zeros(shape));
  p.init_layout(world, rank, offset);
  return p;
}

TEST(FSDPParamLayout, UnevenRows) {
  // 5 rows over 2 ranks: 3 + 2, one padding row.
  FSDPParam r0 = LaidOut({5, 3}, 2, 0), r1 = LaidOut({5, 3}, 2, 1);
  EXPECT_EQ(r0.rows(), 5);
  EXPECT_EQ(r0.row_numel(), 3);
  EXPECT_EQ(r0.shard_rows(), 3);
  EXPECT_EQ(r0.row_start(), 0);
  EXPECT_EQ(r0.local_rows(), 3);
  EXPECT_EQ(r1.row_start(), 3);
  EXPECT_EQ(r1.local_rows(), 2);
  EXPECT_EQ(r1.shard_numel(), 9);
  EXPECT_EQ(r1.local_numel(), 6);
  EXPECT_TRUE(r1.padded(2));
  EXPECT_FALSE(LaidOut({6, 3}, 2, 1).padded(2));
}

TEST(FSDPParamLayout, FewerRowsThanRanks) {
  // 2 rows over 4 ranks: ranks 2 and 3 hold nothing and start past the end.
  for (int rank = 0; rank < 4; ++rank) {
    FSDPParam p = LaidOut({2, 4}, 4, rank);
    EXPECT_EQ(p.shard_rows(), 1);
    EXPECT_EQ(p.local_rows(), rank < 2 ? 1 : 0) << rank;
    EXPECT_EQ(p.row_start(), std::min(rank, 2)) << rank;
    EXPECT_TRUE(p.padded(4));
  }
}

TEST(FSDPParamLayout, ZeroDimensional) {
  // One row of one element: rank 0 holds it, the others hold none.
  FSDPParam r0 = LaidOut({}, 3, 0), r2 = LaidOut({}, 3, 2);
  EXPECT_EQ(r0.rows(), 1);
  EXPECT_EQ(r0.row_numel(), 1);
  EXPECT_EQ(r0.shard_rows(), 1);
  EXPECT_EQ(r0.local_rows(), 1);
  EXPECT_EQ(r2.local_rows(), 0);
  EXPECT_EQ(r2.row_start(), 1);
  EXPECT_EQ(r0.shard_shape(), std::vector<int64_t>({1}));
  EXPECT_EQ(r2.shard_shape(), std::vector<int64_t>({0}));
  EXPECT_EQ(r0.global_numel(), 1);
}

TEST(FSDPParamLayout, ZeroRows) {
  FSDPParam p = LaidOut({0, 5}, 3, 1);
  EXPECT_EQ(p.rows(), 0);
  EXPECT_EQ(p.row_numel(), 5);
  EXPECT_EQ(p.shard_rows(), 0);
  EXPECT_EQ(p.local_rows(), 0);
  EXPECT_EQ(p.shard_numel(), 0);
  EXPECT_FALSE(p.padded(3));
  EXPECT_EQ(p.shard_shape(), std::vector<int64_t>({0, 5}));
}

TEST(FSDPParamLayout, OffsetsFollowPaddedChunks) {
  // [5, 3], a 0-d and a [2] parameter over 2 ranks: chunks of 9, 1 and 1.
  std::vector<FSDPParam> params = Shard(
      {at::randn({5, 3}), at::randn({}), at::randn({2})}, /*world=*/2, /*rank=*/1);
  EXPECT_EQ(params[0].flat_offset(), 0);
  EXPECT_EQ(params[1].flat_offset(), 9);
  EXPECT_EQ(params[2].flat_offset(), 10);
  EXPECT_EQ(FlatNumel(params), 11);
  EXPECT_TRUE(params[0].padded(2));
  EXPECT_TRUE(params[1].padded(2));
  EXPECT_FALSE(params[2].padded(2));
}

TEST(FSDPParamShard, KeepsThisRanksRowsAndReplacesTheModuleParameter) {
  torch::nn::Linear linear(3, 5);  // weight [5, 3]
  const at::Tensor full = linear->weight.detach().clone();
  FSDPParam p("weight", linear->weight);
  p.add_slot(linear.get(), "weight");
  p.add_slot(linear.get(), "weight");  // a duplicate is ignored
  EXPECT_EQ(p.slots().size(), 1u);
  p.init_layout(/*world=*/2, /*rank=*/1, /*flat_offset=*/0);
  p.init_shard(kFloat);

  const at::Tensor& registered = linear->named_parameters()["weight"];
  EXPECT_TRUE(registered.is_same(p.shard()));
  EXPECT_EQ(p.shard().sizes(), at::IntArrayRef({2, 3}));
  EXPECT_TRUE(at::equal(p.shard(), full.narrow(0, 3, 2)));
  EXPECT_TRUE(p.shard().requires_grad());
  EXPECT_TRUE(p.shard().is_leaf());
  // The module's own member is the compute tensor, empty until unsharded.
  EXPECT_TRUE(linear->weight.is_same(p.compute()));
  EXPECT_EQ(p.compute().numel(), 0);
  EXPECT_FALSE(p.compute().requires_grad());
}

TEST(FSDPParamShard, FrozenParameterStaysFrozen) {
  FSDPParam p("frozen", at::randn({4, 2}));  // requires_grad false
  p.init_layout(2, 0, 0);
  p.init_shard(kFloat);
  EXPECT_FALSE(p.requires_grad());
  EXPECT_FALSE(p.shard().requires_grad());
}

// Plays an all-gather: every rank copies its shards into one buffer, then
// rank 0's views must show every full parameter.
TEST(FSDPParamViews, AllGatherCopyInAndUnshardedViewsRoundTrip) {
  const std::vector<at::Tensor> fulls = Corners();
  for (int world = 1; world <= 5; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::vector<FSDPParam> mine = Shard(fulls, world, 0);
    const int64_t flat = FlatNumel(mine);
    at::Tensor unsharded = at::full({world * flat}, NAN);
    for (int rank = 0; rank < world; ++rank) {
      std::vector<FSDPParam> theirs = Shard(fulls, world, rank);
      auto pieces = CopyInForAllGather(theirs, unsharded, world, rank);
      // One piece per parameter that has a chunk, at its offset.
      size_t k = 0;
      for (const FSDPParam& p : theirs) {
        if (p.shard_numel() == 0) continue;
        ASSERT_LT(k, pieces.size());
        EXPECT_EQ(pieces[k].offset, p.flat_offset());
        EXPECT_EQ(pieces[k].numel, p.shard_numel());
        ++k;
      }
      EXPECT_EQ(k, pieces.size());
    }
    EXPECT_FALSE(unsharded.isnan().any().item<bool>()) << "an element was never written";
    for (size_t i = 0; i < fulls.size(); ++i) {
      const FSDPParam& p = mine[i];
      EXPECT_TRUE(at::equal(p.unsharded_view(unsharded, world), fulls[i])) << i;
      // Past the parameter's rows, its region is zero padding.
      const int64_t used = p.global_numel();
      const int64_t region = world * p.shard_numel();
      EXPECT_EQ(at::count_nonzero(unsharded.narrow(
                                      0, world * p.flat_offset() + used, region - used))
                    .item<int64_t>(),
                0)
          << i;
    }
    // The compute tensor points at its view and back.
    mine[0].point_compute_at_unsharded(unsharded, world);
    EXPECT_TRUE(at::equal(mine[0].compute(), fulls[0]));
    mine[0].free_compute(kFloat);
    EXPECT_EQ(mine[0].compute().numel(), 0);
  }
}

// Plays a reduce-scatter: the rank-major input's row r is what rank r
// receives; each rank's view of its row must be its rows of the gradient.
TEST(FSDPParamViews, RankMajorReduceLayout) {
  const std::vector<at::Tensor> fulls = Corners();
  std::vector<at::Tensor> grads;
  for (const auto& t : fulls) grads.push_back(at::randn(t.sizes()));
  for (int world = 1; world <= 5; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::vector<FSDPParam> params = Shard(fulls, world, 0);
    const int64_t flat = FlatNumel(params);
    at::Tensor by_rank = at::zeros({world, flat});
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_grad_to(grads[i], by_rank);
    for (int rank = 0; rank < world; ++rank) {
      std::vector<FSDPParam> theirs = Shard(fulls, world, rank);
      for (size_t i = 0; i < theirs.size(); ++i) {
        const FSDPParam& p = theirs[i];
        EXPECT_TRUE(at::equal(p.reduced_grad_view(by_rank[rank]),
                              p.local_rows_of(grads[i]).reshape(p.shard().sizes())))
            << "rank " << rank << " param " << i;
      }
    }
    // Every gradient element lands once; the padding stays zero.
    double total = 0;
    for (const auto& g : grads) total += g.abs().sum().item<double>();
    EXPECT_NEAR(by_rank.abs().sum().item<double>(), total, 1e-3);
  }
}

TEST(FSDPCollectives, ReduceCopyInZeroesPaddingAndMissingGradsAndReleasesThem) {
  const std::vector<at::Tensor> fulls = {at::randn({5, 3}), at::randn({4})};
  const int world = 2;
  std::vector<FSDPParam> params = Shard(fulls, world, 0);
  const int64_t flat = FlatNumel(params);
  std::vector<at::Tensor> grads = {at::randn({5, 3}), at::Tensor()};
  const at::Tensor g0 = grads[0].clone();
  at::Tensor input = CopyInForReduce(params, grads, world, flat, /*padded=*/true,
                                     at::TensorOptions().dtype(at::kDouble));
  EXPECT_EQ(input.scalar_type(), at::kDouble);
  // Every rank's row: the flat shard, then one contribution flag per parameter.
  const int64_t width = flat + 2;
  EXPECT_EQ(input.numel(), world * width);
  EXPECT_FALSE(grads[0].defined()) << "a copied gradient is released";
  const at::Tensor by_rank = input.view({world, width});
  EXPECT_TRUE(at::equal(by_rank[0].narrow(0, 0, 9), g0.narrow(0, 0, 3).reshape({-1}).to(at::kDouble)));
  EXPECT_TRUE(at::equal(by_rank[1].narrow(0, 0, 6), g0.narrow(0, 3, 2).reshape({-1}).to(at::kDouble)));
  EXPECT_EQ(at::count_nonzero(by_rank[1].narrow(0, 6, 3)).item<int64_t>(), 0);
  EXPECT_EQ(at::count_nonzero(by_rank.narrow(1, 9, 2)).item<int64_t>(), 0)
      << "an undefined gradient reduces as zeros";
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(by_rank[r][flat].item<double>(), 1.0) << "param 0 has a gradient";
    EXPECT_EQ(by_rank[r][flat + 1].item<double>(), 0.0) << "param 1 has none";
  }
}

// A rank that has no gradient at all still contributes a reduction input:
// zeros and zero flags, even over a recycled pool buffer.
TEST(FSDPCollectives, ReduceCopyInWithoutGradientsIsAllZero) {
  const std::vector<at::Tensor> fulls = {at::randn({4, 2}), at::randn({2})};
  const int world = 2;
  std::vector<FSDPParam> params = Shard(fulls, world, 1);
  const int64_t flat = FlatNumel(params);
  for (int round = 0; round < 2; ++round) {
    std::vector<at::Tensor> grads(2);
    at::Tensor input = CopyInForReduce(params, grads, world, flat, /*padded=*/false,
                                       at::TensorOptions().dtype(at::kDouble));
    EXPECT_EQ(input.numel(), world * (flat + 2));
    EXPECT_EQ(at::count_nonzero(input).item<int64_t>(), 0);
    input.fill_(7.0);  // dirty it for the next round's pool buffer
  }
}

TEST(FSDPParamGrad, AccumulateMakesAnOwnedCopyThenAdds) {
  std::vector<FSDPParam> params = Shard({at::randn({4, 2})}, 1, 0);
  FSDPParam& p = params[0];
  at::Tensor flat = at::ones({16}, at::TensorOptions().dtype(at::kDouble));
  p.accumulate_grad(flat.narrow(0, 0, 8).view({4, 2}));
  const at::Tensor grad = p.shard().grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_EQ(grad.scalar_type(), at::kFloat);
  EXPECT_FALSE(grad.is_view());
  EXPECT_NE(grad.data_ptr(), flat.data_ptr());
  p.accumulate_grad(at::full({4, 2}, 2.0));
  EXPECT_TRUE(at::equal(p.shard().grad(), at::full({4, 2}, 3.0)));
}

}  // namespace
}  // namespace fsdp
}  // namespace fsdp2
