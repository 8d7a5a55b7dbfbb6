#include "tests/harness/multi_process.h"

#include "core/launch/local_launcher.h"

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace fsdp2 {
namespace testing {
namespace {

std::map<std::string, Scenario>& Scenarios() {
  static auto* scenarios = new std::map<std::string, Scenario>();
  return *scenarios;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string NewOutDir() {
  static std::atomic<int> counter{0};
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string base = tmp ? tmp : "/tmp";
  std::string dir = base + "/fsdp2_launch_" + std::to_string(getpid()) + "_" +
                    std::to_string(counter++);
  mkdir(dir.c_str(), 0755);
  return dir;
}

}  // namespace

ScenarioRegistrar::ScenarioRegistrar(const char* name, Scenario scenario) {
  Scenarios()[name] = std::move(scenario);
}

std::string WorkerOutDir() {
  const char* dir = std::getenv("FSDP2_TEST_OUT");
  return dir ? dir : ".";
}

bool LaunchResult::ok() const {
  for (const auto& r : ranks) {
    if (r.exit_code != 0 || r.timed_out) return false;
  }
  return true;
}

std::string LaunchResult::Describe() const {
  std::ostringstream s;
  for (const auto& r : ranks) {
    s << "---- rank " << r.rank << ": "
      << (r.timed_out ? "timed out" : "exit " + std::to_string(r.exit_code))
      << " ----\n"
      << r.log << "\n";
  }
  return s.str();
}

LaunchResult LaunchRanks(const LaunchOptions& options) {
  LaunchResult result;
  result.out_dir = NewOutDir();
  const int n = options.world_size;
  std::vector<pid_t> pids(n, -1);
  std::vector<std::string> logs(n);
  for (int rank = 0; rank < n; ++rank) {
    auto env = launch::CurrentEnvironment();
    env["RANK"] = std::to_string(rank);
    env["WORLD_SIZE"] = std::to_string(n);
    env["LOCAL_RANK"] = std::to_string(rank);
    env["FSDP2_STORE_PATH"] = result.out_dir + "/store";
    env["FSDP2_TEST_OUT"] = result.out_dir;
    env["OMP_NUM_THREADS"] = "1";
    for (const auto& kv : launch::CpuPerformanceEnv()) env[kv.first] = kv.second;
    for (const auto& kv : options.env) env[kv.first] = kv.second;
    auto it = options.rank_env.find(rank);
    if (it != options.rank_env.end()) {
      for (const auto& kv : it->second) env[kv.first] = kv.second;
    }
    std::vector<std::string> argv = {"/proc/self/exe", "--fsdp2_worker",
                                     options.scenario};
    argv.insert(argv.end(), options.args.begin(), options.args.end());
    logs[rank] = result.out_dir + "/rank" + std::to_string(rank) + ".log";
    int fd = open(logs[rank].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot create " + logs[rank]);
    pids[rank] = launch::SpawnSelf(argv, env, fd);
    close(fd);
  }

  result.ranks.resize(n);
  std::vector<bool> done(n, false);
  int remaining = n;
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  bool killing = false;
  while (remaining > 0) {
    for (int rank = 0; rank < n; ++rank) {
      if (done[rank]) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) != pids[rank]) continue;
      done[rank] = true;
      --remaining;
      auto& r = result.ranks[rank];
      r.rank = rank;
      r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status)
                                      : 128 + WTERMSIG(status);
      if (r.exit_code != 0 && !killing) {
        // One rank failed: give the others a moment to fail on their own
        // (their errors are informative), then stop them.
        killing = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        for (int other = 0; other < n; ++other) {
          if (!done[other]) kill(pids[other], SIGKILL);
        }
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int rank = 0; rank < n; ++rank) {
        if (!done[rank]) {
          kill(pids[rank], SIGKILL);
          result.ranks[rank].timed_out = true;
        }
      }
      for (int rank = 0; rank < n; ++rank) {
        if (!done[rank]) {
          int status;
          waitpid(pids[rank], &status, 0);
          done[rank] = true;
          result.ranks[rank].rank = rank;
          result.ranks[rank].exit_code = 128 + SIGKILL;
        }
      }
      remaining = 0;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int rank = 0; rank < n; ++rank) result.ranks[rank].log = ReadFile(logs[rank]);
  return result;
}

int TestMain(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--fsdp2_worker") == 0) {
    at::set_num_threads(1);
    auto it = Scenarios().find(argv[2]);
    if (it == Scenarios().end()) {
      std::cerr << "unknown scenario " << argv[2] << "\n";
      return 2;
    }
    try {
      it->second(std::vector<std::string>(argv + 3, argv + argc));
    } catch (const std::exception& e) {
      std::cerr << "rank " << (std::getenv("RANK") ? std::getenv("RANK") : "?")
                << " failed: " << e.what() << "\n";
      return 1;
    }
    std::cout.flush();
    return 0;
  }
  at::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace testing
}  // namespace fsdp2
