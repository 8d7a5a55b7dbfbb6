// fsdp2/tests/checkpoint_compat_test.cc
//
// Checkpoints written by an earlier fsdp2 load in this one. The fixture in
// tests/data/checkpoint_v1 was written by the main job before its CRC-32
// became zlib's and its reads and writes were streamed (`examples:train
// --nproc 2 --steps 3 --n-layer 1 --n-embd 16 --n-head 2 --block-size 8
// --batch-size 2 --data synthetic --vocab-size 32`, once with
// --checkpoint-format sharded and once full: the same training, so the same
// state). On 1, 2 and 3 ranks, each format is loaded (every checksum
// verified) and saved again as a full checkpoint; that file must hold
// bit for bit the tensors of the old full checkpoint, with the same
// metadata: the same checksums, computed now by the new code over the same
// bytes, and the same progress and optimizer settings.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/checkpoint/safetensors.h"
#include "core/models/gpt_module.h"
#include "core/strategy/fsdp2_strategy.h"
#include "tests/harness/multi_process.h"

namespace fsdp2 {
namespace testing {
namespace {

const char* kFixture = "tests/data/checkpoint_v1";

// The main job's model and optimizer at the fixture's flags.
std::shared_ptr<models::GPTModule> FixtureModule() {
  models::GPTConfig c;
  c.n_layer = 1;
  c.n_embd = 16;
  c.n_head = 2;
  c.block_size = 8;
  c.vocab_size = 32;
  return std::make_shared<models::GPTModule>(c, models::GPT2AdamW(3e-3));
}

// args: checkpoint-to-load out-dir. Loads it and saves it as a full
// checkpoint in out-dir.
FSDP2_SCENARIO(resave) {
  strategy::FSDP2StrategyOptions options;
  options.checkpoint_format = strategy::CheckpointFormat::kFull;
  options.timeout = std::chrono::seconds(60);
  strategy::FSDP2Strategy s(options);
  s.setup_environment();
  s.connect(FixtureModule());
  s.parallelize();
  s.load_checkpoint(args.at(0));
  if (s.current_epoch_step().step != 3) throw std::runtime_error("step 3 not restored");
  s.save_checkpoint(args.at(1));
}

// Every tensor and metadata entry of `a` equals `b`'s.
void ExpectSameFile(const std::string& a_path, const std::string& b_path) {
  checkpoint::SafetensorsFile a(a_path), b(b_path);
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& [name, info] : a.tensors()) {
    ASSERT_TRUE(b.contains(name)) << name;
    at::Tensor x = a.load(name), y = b.load(name);  // both checksums verified
    EXPECT_TRUE(x.equal(y)) << name;
  }
  EXPECT_EQ(a.metadata(), b.metadata());
}

TEST(CheckpointCompat, CheckpointsOfTheEarlierFormatLoadOnAnyNumberOfRanks) {
  const std::string old_full = std::string(kFixture) + "/full/checkpoint.safetensors";
  for (const std::string format : {"sharded", "full"}) {
    for (int ranks : {1, 2, 3}) {
      const std::string out = std::string(std::getenv("TEST_TMPDIR")) + "/from_" + format +
                              std::to_string(ranks);
      auto r = LaunchScenario("resave", ranks,
                              {std::string(kFixture) + "/" + format, out},
                              std::chrono::seconds(120));
      ASSERT_TRUE(r.ok()) << format << " on " << ranks << " ranks\n" << r.Describe();
      ExpectSameFile(out + "/checkpoint.safetensors", old_full);
    }
  }
}

// The checksums themselves: the old files' values are what zlib computes.
TEST(CheckpointCompat, OldChecksumsAreZlibsCrc32) {
  checkpoint::SafetensorsFile f(std::string(kFixture) + "/sharded/rank1-of-2.safetensors");
  ASSERT_FALSE(f.tensors().empty());
  for (const auto& [name, info] : f.tensors()) {
    at::Tensor t = f.load_rows(name, 0, info.shape.empty() ? 1 : info.shape[0]);
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08x",
                  checkpoint::Crc32(t.data_ptr(), t.numel() * t.element_size()));
    EXPECT_EQ(f.metadata().at("fsdp2.crc32." + name), hex) << name;
  }
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
