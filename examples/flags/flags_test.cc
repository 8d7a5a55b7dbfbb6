#include "examples/flags/flags.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

namespace fsdp2 {
namespace flags {
namespace {

// Flags over a command line given as strings (argv[0] is "prog").
struct CommandLine {
  explicit CommandLine(std::initializer_list<std::string> args) : words(args) {
    argv.push_back("prog");
    for (const auto& w : words) argv.push_back(w.c_str());
  }
  Flags Parse() const {
    return Flags(static_cast<int>(argv.size()), argv.data(), "usage: prog [flags]");
  }
  std::vector<std::string> words;
  std::vector<const char*> argv;
};

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const FlagError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Flags, BothSyntaxesDefaultsAndTheLastValueWins) {
  CommandLine line({"--steps", "12", "--lr=0.5", "--data", "a.txt", "--steps=7"});
  Flags flags = line.Parse();
  EXPECT_EQ(flags.Int("steps", 30, "steps"), 7);
  EXPECT_EQ(flags.Double("lr", 3e-3, "learning rate"), 0.5);
  EXPECT_EQ(flags.String("data", "pystdlib", "text"), "a.txt");
  EXPECT_EQ(flags.Int("seed", 1337, "seed"), 1337);
  EXPECT_EQ(flags.String("out", "", "dir"), "");
  EXPECT_NO_THROW(flags.Finish());
}

TEST(Flags, NegativeNumbersAndEmptyValues) {
  CommandLine line({"--progress-bar", "-1", "--out=", "--clip", "-0.5"});
  Flags flags = line.Parse();
  EXPECT_EQ(flags.Int("progress-bar", 0, ""), -1);
  EXPECT_EQ(flags.String("out", "x", ""), "");
  EXPECT_EQ(flags.Double("clip", 1, ""), -0.5);
}

TEST(Flags, ErrorsAreOneLineSayingWhatIsWrong) {
  EXPECT_EQ(ErrorOf([] { CommandLine({"--nproc"}).Parse(); }), "flag --nproc needs a value");
  EXPECT_EQ(ErrorOf([] { CommandLine({"extra"}).Parse(); }),
            "unexpected argument 'extra' (see --help)");
  EXPECT_EQ(ErrorOf([] {
              CommandLine line({"--bogus", "1", "--steps", "2", "--another", "3"});
              Flags flags = line.Parse();
              flags.Int("steps", 1, "");
              flags.Finish();
            }),
            "unknown flag --another (see --help)");
  for (const std::string bad : {"x", "2.5", "", "3 "}) {
    EXPECT_EQ(ErrorOf([&] { CommandLine({"--steps", bad}).Parse().Int("steps", 1, ""); }),
              "--steps expects an integer, got '" + bad + "'");
  }
  for (const std::string bad : {"fast", "1e-3x", ""}) {
    EXPECT_EQ(ErrorOf([&] { CommandLine({"--lr", bad}).Parse().Double("lr", 1, ""); }),
              "--lr expects a number, got '" + bad + "'");
  }
}

TEST(Flags, IntegerLists) {
  CommandLine line({"--nprocs", "1,2,4"});
  Flags flags = line.Parse();
  EXPECT_EQ(flags.IntList("nprocs", {2, 4}, ""), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(flags.IntList("other", {2, 4}, ""), (std::vector<int64_t>{2, 4}));
  for (const std::string bad : {"1,,2", "two", "1,2,", ""}) {
    EXPECT_EQ(ErrorOf([&] { CommandLine({"--nprocs", bad}).Parse().IntList("nprocs", {}, ""); }),
              "--nprocs expects integers separated by commas, got '" + bad + "'");
  }
}

TEST(Flags, WordLists) {
  CommandLine line({"--precisions", "fp32,bf16"});
  Flags flags = line.Parse();
  EXPECT_EQ(flags.StringList("precisions", {"fp32"}, ""),
            (std::vector<std::string>{"fp32", "bf16"}));
  EXPECT_EQ(flags.StringList("models", {"3m", "85m"}, ""),
            (std::vector<std::string>{"3m", "85m"}));
  for (const std::string bad : {"a,,b", "a,", ""}) {
    EXPECT_EQ(ErrorOf([&] { CommandLine({"--models", bad}).Parse().StringList("models", {}, ""); }),
              "--models expects words separated by commas, got '" + bad + "'");
  }
}

TEST(Flags, HelpListsWhatWasReadWithDefaultsAndIgnoresTheRest) {
  CommandLine line({"--steps", "oops", "--help", "--not-read", "1"});
  Flags flags = line.Parse();
  EXPECT_TRUE(flags.help_requested());
  EXPECT_EQ(flags.Int("steps", 30, "optimizer steps"), 30);  // not parsed after --help
  flags.Double("lr", 3e-3, "learning rate");
  flags.String("data", "pystdlib", "PATH, pystdlib or synthetic");
  flags.String("out-dir", "", "where metrics go");
  flags.IntList("nprocs", {2, 4}, "rank counts");
  const std::string help = flags.Help();
  EXPECT_EQ(help.rfind("usage: prog [flags]\n", 0), 0u) << help;
  EXPECT_NE(help.find("--steps N"), std::string::npos) << help;
  EXPECT_NE(help.find("optimizer steps (default 30)"), std::string::npos) << help;
  EXPECT_NE(help.find("learning rate (default 0.003)"), std::string::npos) << help;
  EXPECT_NE(help.find("PATH, pystdlib or synthetic (default pystdlib)"), std::string::npos);
  EXPECT_NE(help.find("where metrics go\n"), std::string::npos) << help;
  EXPECT_NE(help.find("--nprocs N,N,...           rank counts (default 2,4)"), std::string::npos)
      << help;
  EXPECT_EXIT(flags.Finish(), ::testing::ExitedWithCode(0), "");
}

TEST(Flags, ShortHelpToo) {
  CommandLine line({"-h"});
  EXPECT_TRUE(line.Parse().help_requested());
}

}  // namespace
}  // namespace flags
}  // namespace fsdp2
