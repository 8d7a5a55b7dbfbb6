// fsdp2/tests/harness/multi_process.h
//
// Runs N ranks of the current test binary as separate processes and collects
// what each did. A test binary built with this harness is both a gtest binary
// and a worker: started as `<binary> --fsdp2_worker <scenario> args...` it
// runs the named scenario (registered with FSDP2_SCENARIO) as one rank,
// with RANK, WORLD_SIZE and FSDP2_STORE_PATH (a FileStore) set.
//
// Every launch has a timeout: a rank that hangs is killed, and the test
// fails with each rank's log instead of hanging CI.
#ifndef FSDP2_TESTS_HARNESS_MULTI_PROCESS_H_
#define FSDP2_TESTS_HARNESS_MULTI_PROCESS_H_

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fsdp2 {
namespace testing {

struct RankResult {
  int rank = 0;
  int exit_code = 0;   // or 128 + signal
  bool timed_out = false;
  std::string log;     // stdout and stderr
};

struct LaunchOptions {
  int world_size = 1;
  std::string scenario;
  std::vector<std::string> args;
  std::chrono::seconds timeout{180};
  std::map<std::string, std::string> env;                 // every rank
  std::map<int, std::map<std::string, std::string>> rank_env;  // overrides
};

struct LaunchResult {
  std::vector<RankResult> ranks;
  std::string out_dir;  // FSDP2_TEST_OUT of the ranks: their result files

  bool ok() const;
  // Each failing rank's exit status and log, for a test failure message.
  std::string Describe() const;
};

LaunchResult LaunchRanks(const LaunchOptions& options);

// LaunchRanks with the scenario, world size, arguments and timeout given
// and everything else left at its default.
LaunchResult LaunchScenario(const std::string& scenario, int world_size,
                            std::vector<std::string> args = {},
                            std::chrono::seconds timeout = std::chrono::seconds(180));

// What a rank wrote: the whole file (empty if it is missing), or the
// whitespace-separated numbers in it.
std::string ReadFile(const std::string& path);
std::vector<double> ReadNumbers(const std::string& path);

// Worker side: the directory this launch's ranks write results into.
std::string WorkerOutDir();

using Scenario = std::function<void(const std::vector<std::string>& args)>;

struct ScenarioRegistrar {
  ScenarioRegistrar(const char* name, Scenario scenario);
};

#define FSDP2_SCENARIO(name)                                            \
  static void Fsdp2Scenario_##name(const std::vector<std::string>& args); \
  static ::fsdp2::testing::ScenarioRegistrar fsdp2_scenario_##name(       \
      #name, Fsdp2Scenario_##name);                                      \
  static void Fsdp2Scenario_##name(const std::vector<std::string>& args)

// main() of a harness test binary: a worker if asked, else gtest.
int TestMain(int argc, char** argv);

}  // namespace testing
}  // namespace fsdp2

#endif  // FSDP2_TESTS_HARNESS_MULTI_PROCESS_H_
