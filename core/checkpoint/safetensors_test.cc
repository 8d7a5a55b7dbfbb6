#include "core/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace fsdp2 {
namespace checkpoint {
namespace {

std::string Tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

NamedTensors Sample() {
  return {{"w", at::arange(12, at::kFloat).view({3, 4})},
          {"d", at::randn({5}, at::kDouble)},
          {"h", at::randn({2, 2}).to(at::kBFloat16)},
          {"i", at::arange(6, at::kLong).view({2, 3})},
          {"flag", at::ones({4}, at::kBool)},
          {"empty", at::zeros({0, 4})},
          {"scalar", at::full({}, 3.5)}};
}

template <typename F>
void ExpectError(F f, const std::string& text) {
  try {
    f();
    FAIL() << "expected an error containing '" << text << "'";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  const auto path = Tmp("round.safetensors");
  WriteSafetensors(path, Sample(), {{"step", "42"}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("step"), "42");
  EXPECT_EQ(f.metadata().at("fsdp2.format_version"), "1");
  for (const auto& [name, t] : Sample()) {
    if (name == "d" || name == "h") continue;  // random: checked below
    EXPECT_TRUE(f.load(name).equal(t)) << name;
  }
  auto s = Sample();
  WriteSafetensors(path, s);
  SafetensorsFile g(path);
  EXPECT_TRUE(g.load("d").equal(s[1].second));
  EXPECT_TRUE(g.load("h").equal(s[2].second));
  EXPECT_EQ(g.info("scalar").shape.size(), 0u);
}

TEST(Safetensors, LoadsRowRangesOnly) {
  const auto path = Tmp("rows.safetensors");
  at::Tensor w = at::arange(20, at::kFloat).view({5, 4});
  WriteSafetensors(path, {{"w", w}});
  SafetensorsFile f(path);
  EXPECT_TRUE(f.load_rows("w", 1, 3).equal(w.narrow(0, 1, 3)));
  EXPECT_EQ(f.load_rows("w", 5, 0).size(0), 0);
  ExpectError([&] { f.load_rows("w", 4, 2); }, "outside tensor 'w'");
  ExpectError([&] { f.load("nope"); }, "no tensor named 'nope'");
}

TEST(Safetensors, LoadsRowsIntoGivenMemory) {
  const auto path = Tmp("rows_into.safetensors");
  at::Tensor w = at::arange(20, at::kFloat).view({5, 4});
  WriteSafetensors(path, {{"w", w}});
  SafetensorsFile f(path);
  at::Tensor out = at::full({4, 4}, -1.0f);
  f.load_rows_into("w", 2, 3, out.narrow(0, 1, 3));
  EXPECT_TRUE(out.narrow(0, 1, 3).equal(w.narrow(0, 2, 3)));
  EXPECT_TRUE(out[0].equal(at::full({4}, -1.0f)));  // nothing outside the rows
  f.load_rows_into("w", 5, 0, out.narrow(0, 0, 0));
  ExpectError([&] { f.load_rows_into("w", 0, 2, at::empty({2, 4}, at::kDouble)); },
              "cannot be read into a Double tensor");
  ExpectError([&] { f.load_rows_into("w", 0, 2, at::empty({3, 4})); }, "of 48 bytes");
  ExpectError([&] { f.load_rows_into("w", 0, 2, at::empty({4, 2}).t()); }, "cannot be read");
  ExpectError([&] { f.load_rows_into("w", 4, 2, at::empty({2, 4})); }, "outside tensor 'w'");
}

TEST(Safetensors, LoadEachChecksEveryTensorAndKeepsOnlyThoseAsked) {
  const auto path = Tmp("each.safetensors");
  at::Tensor big = at::arange(3 << 20, at::kFloat);  // 12 MiB: more than one read
  WriteSafetensors(path, {{"w", at::arange(12, at::kFloat)}, {"big", big}});
  std::vector<std::string> seen;
  SafetensorsFile(path).load_each(
      [&](const std::string& name, at::Tensor t) {
        seen.push_back(name);
        EXPECT_TRUE(t.equal(at::arange(12, at::kFloat)));
      },
      [](const std::string& name) { return name == "w"; });
  EXPECT_EQ(seen, std::vector<std::string>{"w"});
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-(1 << 20), std::ios::end);  // inside "big", which is not kept
    const char was = static_cast<char>(f.get());
    f.seekp(-(1 << 20), std::ios::end);
    f.put(static_cast<char>(~was));
  }
  ExpectError(
      [&] {
        SafetensorsFile(path).load_each([](const std::string&, at::Tensor) {},
                                        [](const std::string& name) { return name == "w"; });
      },
      "checksum mismatch for tensor 'big'");
}

TEST(Safetensors, AFileReplacedAfterItsHeaderWasReadIsAnError) {
  const auto path = Tmp("replaced.safetensors");
  WriteSafetensors(path, {{"w", at::arange(12, at::kFloat)}});
  SafetensorsFile f(path);
  f.check_unchanged();
  WriteSafetensors(path, {{"w", at::arange(12, at::kFloat) * 2}});  // a new file, renamed in
  ExpectError([&] { f.check_unchanged(); }, "changed while it was being loaded");
  ExpectError([&] { f.load("w"); }, "changed while it was being loaded");
  ExpectError([&] { f.load_rows("w", 0, 1); }, "changed while it was being loaded");
  EXPECT_TRUE(SafetensorsFile(path).load("w").equal(at::arange(12, at::kFloat) * 2));
  SafetensorsFile g(path);
  ASSERT_EQ(truncate(path.c_str(), 100), 0);  // cut short in place: the same inode
  ExpectError([&] { g.load_rows_into("w", 0, 1, at::empty({1})); },
              "changed while it was being loaded");
}

TEST(Safetensors, CorruptedDataFailsTheChecksum) {
  const auto path = Tmp("corrupt.safetensors");
  WriteSafetensors(path, {{"w", at::ones({64})}});
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  ExpectError([&] { SafetensorsFile(path).load("w"); }, "checksum mismatch for tensor 'w'");
}

TEST(Safetensors, TruncatedForeignMissingAndDirectoryPathsAreClearErrors) {
  const auto path = Tmp("trunc.safetensors");
  WriteSafetensors(path, {{"w", at::ones({64})}});
  struct stat st {};
  stat(path.c_str(), &st);
  ASSERT_EQ(truncate(path.c_str(), st.st_size - 10), 0);
  ExpectError([&] { SafetensorsFile f(path); }, "truncated");
  ASSERT_EQ(truncate(path.c_str(), 5), 0);
  ExpectError([&] { SafetensorsFile f(path); }, "truncated");

  const auto foreign = Tmp("foreign.bin");
  std::ofstream(foreign) << "definitely not a safetensors file, just some text";
  ExpectError([&] { SafetensorsFile f(foreign); }, "not a safetensors file");

  ExpectError([&] { SafetensorsFile f(Tmp("missing.safetensors")); }, "no such file");
  ExpectError([&] { SafetensorsFile f(Tmp("")); }, "is a directory");
  ExpectError([&] { WriteSafetensors(Tmp(""), {{"w", at::ones({1})}}); },
              "is a directory");
}

TEST(Safetensors, HeaderThatLiesAboutSizesIsRejected) {
  const auto path = Tmp("lying.safetensors");
  std::string json = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  bytes += json + std::string(16, '\0');
  WriteFileAtomically(path, bytes);
  ExpectError([&] { SafetensorsFile f(path); }, "need 16 bytes but its range holds 8");
}

TEST(Safetensors, RejectsDuplicateNames) {
  EXPECT_THROW(WriteSafetensors(Tmp("dup.safetensors"),
                                {{"a", at::ones({1})}, {"a", at::ones({1})}}),
               std::invalid_argument);
}

TEST(Safetensors, AtomicWriteLeavesNoTemporaryAndReplacesWhole) {
  const auto path = Tmp("atomic.safetensors");
  WriteSafetensors(path, {{"w", at::zeros({1000})}});
  WriteSafetensors(path, {{"v", at::ones({3})}});
  SafetensorsFile f(path);
  EXPECT_FALSE(f.contains("w"));
  EXPECT_TRUE(f.load("v").equal(at::ones({3})));
  struct stat st {};
  EXPECT_NE(stat((path + ".tmp." + std::to_string(getpid())).c_str(), &st), 0);
}

TEST(Safetensors, Crc32MatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32("123456789", 9), 0xCBF43926u);
  // A value continued over pieces is the value of the whole.
  EXPECT_EQ(Crc32("56789", 5, Crc32("1234", 4)), 0xCBF43926u);
  EXPECT_EQ(Crc32("", 0), 0u);
}

// Tensors larger than the 8 MiB pieces data moves in: written and read in
// several pieces, with one checksum over all of them; a flipped byte in a
// later piece is still caught, and a row range across pieces is exact.
TEST(Safetensors, TensorsOfManyPiecesRoundTripAndAreChecked) {
  const auto path = Tmp("large.safetensors");
  at::Tensor big = at::randn({5 << 20});  // 20 MiB: three pieces
  at::Tensor small = at::arange(7, at::kLong);
  WriteSafetensors(path, {{"small", small}, {"big", big}});
  {
    SafetensorsFile f(path);
    EXPECT_TRUE(f.load("big").equal(big));
    EXPECT_TRUE(f.load("small").equal(small));
    at::Tensor rows = f.load_rows("big", (2 << 20) - 3, 3 << 20);
    EXPECT_TRUE(rows.equal(big.narrow(0, (2 << 20) - 3, 3 << 20)));
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08x",
                  Crc32(big.data_ptr(), big.numel() * big.element_size()));
    EXPECT_EQ(f.metadata().at("fsdp2.crc32.big"), hex);
  }
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-(1 << 20), std::ios::end);  // inside the last piece of "big"
    const char was = static_cast<char>(f.get());
    f.seekp(-(1 << 20), std::ios::end);
    f.put(static_cast<char>(~was));
  }
  SafetensorsFile f(path);
  EXPECT_TRUE(f.load("small").equal(small));
  ExpectError([&] { f.load("big"); }, "checksum mismatch for tensor 'big'");
}

}  // namespace
}  // namespace checkpoint
}  // namespace fsdp2
