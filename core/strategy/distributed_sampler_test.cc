#include "core/strategy/distributed_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace fsdp2 {
namespace strategy {
namespace {

DistributedSamplerOptions Opts(int64_t global, bool shuffle = true,
                               bool drop_last = true, uint64_t seed = 3) {
  DistributedSamplerOptions o;
  o.global_batch_size = global;
  o.shuffle = shuffle;
  o.drop_last = drop_last;
  o.seed = seed;
  return o;
}

// The ranks' local batches, concatenated in rank order, are the global batch,
// and the global batches are the same for every world size.
TEST(DistributedSampler, GlobalBatchesDoNotDependOnWorldSize) {
  const int64_t n = 50, global = 12;
  DistributedSampler one(n, 0, 1, Opts(global));
  for (int world : {2, 3, 4}) {
    std::vector<DistributedSampler> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(n, r, world, Opts(global));
    for (int epoch : {0, 1}) {
      one.set_epoch(epoch);
      for (auto& s : ranks) s.set_epoch(epoch);
      ASSERT_EQ(ranks[0].num_batches(), one.num_batches());
      for (int64_t b = 0; b < one.num_batches(); ++b) {
        std::vector<int64_t> joined;
        for (auto& s : ranks) {
          auto local = s.local_batch(b);
          EXPECT_EQ(static_cast<int64_t>(local.size()), global / world);
          joined.insert(joined.end(), local.begin(), local.end());
        }
        EXPECT_EQ(joined, one.global_batch(b)) << "world " << world;
      }
    }
  }
}

TEST(DistributedSampler, EpochIsAPermutationThatChangesWithTheEpoch) {
  DistributedSampler s(24, 0, 1, Opts(6));
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t b = 0; b < s.num_batches(); ++b) {
    auto g = s.global_batch(b);
    epoch0.insert(epoch0.end(), g.begin(), g.end());
  }
  s.set_epoch(1);
  for (int64_t b = 0; b < s.num_batches(); ++b) {
    auto g = s.global_batch(b);
    epoch1.insert(epoch1.end(), g.begin(), g.end());
  }
  EXPECT_NE(epoch0, epoch1);
  std::sort(epoch0.begin(), epoch0.end());
  std::sort(epoch1.begin(), epoch1.end());
  std::vector<int64_t> all(24);
  for (int i = 0; i < 24; ++i) all[i] = i;
  EXPECT_EQ(epoch0, all);
  EXPECT_EQ(epoch1, all);
}

TEST(DistributedSampler, SeedDecidesTheOrder) {
  DistributedSampler a(100, 0, 1, Opts(10, true, true, 1));
  DistributedSampler b(100, 0, 1, Opts(10, true, true, 1));
  DistributedSampler c(100, 0, 1, Opts(10, true, true, 2));
  EXPECT_EQ(a.global_batch(3), b.global_batch(3));
  EXPECT_NE(a.global_batch(3), c.global_batch(3));
}

TEST(DistributedSampler, NoShuffleIsSequential) {
  DistributedSampler s(10, 1, 2, Opts(4, /*shuffle=*/false));
  EXPECT_EQ(s.local_batch(0), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s.local_batch(1), (std::vector<int64_t>{6, 7}));
}

TEST(DistributedSampler, DropLastOrPad) {
  DistributedSampler drop(10, 0, 2, Opts(4, false, /*drop_last=*/true));
  EXPECT_EQ(drop.num_batches(), 2);
  DistributedSampler pad(10, 0, 2, Opts(4, false, /*drop_last=*/false));
  EXPECT_EQ(pad.num_batches(), 3);
  EXPECT_EQ(pad.global_batch(2), (std::vector<int64_t>{8, 9, 0, 1}));
  EXPECT_THROW(drop.global_batch(2), std::out_of_range);
}

TEST(DistributedSampler, BadArguments) {
  EXPECT_THROW(DistributedSampler(0, 0, 1, Opts(1)), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 2, 2, Opts(2)), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 0, 3, Opts(4)), std::invalid_argument);
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
