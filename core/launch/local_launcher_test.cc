// The launcher runs this binary as ranks; what each rank does is chosen by
// FSDP2_LAUNCHER_TEST_MODE.
#include "core/launch/local_launcher.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/launch/allocator.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>
#include <thread>

namespace fsdp2 {
namespace launch {
namespace {

int RankMain(const std::string& mode, char** argv) {
  const int rank = std::atoi(std::getenv("RANK"));
  if (mode == "allocator") {
    std::cout << "rank " << rank << " allocator " << ActiveAllocator() << std::endl;
    return 0;
  }
  if (mode == "reexec") {  // as the main job does under an outside launcher
    {  // one line per run of this process, restarts included, with the
       // name the kernel gives it (what ps, top and pgrep show)
      std::string name;
      std::getline(std::ifstream("/proc/self/comm"), name);
      std::ofstream runs(std::getenv("FSDP2_TEST_RUNS_FILE"), std::ios::app);
      runs << name << "\n";
    }
    ReexecWithRankEnvironment(argv);
    auto value = [](const char* name) {
      const char* v = std::getenv(name);
      return std::string(v != nullptr ? v : "(unset)");
    };
    std::cout << "rank " << rank << " allocator " << ActiveAllocator()
              << " wait policy " << value("OMP_WAIT_POLICY")
              << " marker " << value("FSDP2_RANK_ENV_EXEC") << std::endl;
    return 0;
  }
  if (mode == "hello") {
    std::cout << "hello from " << rank << " of " << std::getenv("WORLD_SIZE")
              << " port " << std::getenv("MASTER_PORT") << " threads "
              << std::getenv("OMP_NUM_THREADS") << std::endl;
    return 0;
  }
  if (mode == "rank1_fails") {
    if (rank == 1) return 3;
    std::this_thread::sleep_for(std::chrono::seconds(60));  // must be stopped
    return 0;
  }
  return 99;
}

int Launch(const std::string& mode, int nproc, int threads = 0) {
  LocalLaunchOptions o;
  o.nproc = nproc;
  o.threads_per_rank = threads;
  o.env["FSDP2_LAUNCHER_TEST_MODE"] = mode;
  return LaunchLocal(o);
}

TEST(LocalLauncher, EveryRankRunsWithItsEnvironment) {
  ::testing::internal::CaptureStdout();
  const int code = Launch("hello", 3, /*threads=*/2);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 0);
  for (int r = 0; r < 3; ++r) {
    const std::string line = "[rank " + std::to_string(r) + "] hello from " +
                             std::to_string(r) + " of 3 port ";
    EXPECT_NE(out.find(line), std::string::npos) << out;
  }
  EXPECT_NE(out.find("threads 2"), std::string::npos) << out;
}

TEST(LocalLauncher, OneFailingRankStopsTheOthers) {
  ::testing::internal::CaptureStderr();
  const auto start = std::chrono::steady_clock::now();
  const int code = Launch("rank1_fails", 3);
  const auto took = std::chrono::steady_clock::now() - start;
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 3);
  EXPECT_NE(err.find("rank 1 failed (exit code 3)"), std::string::npos) << err;
  EXPECT_LT(took, std::chrono::seconds(30)) << "the sleeping ranks were not stopped";
}

// The defaults the ranks get for fast CPU training, each only where the
// caller has not set the variable.
TEST(LocalLauncher, PerformanceDefaultsYieldToTheCallersEnvironment) {
  unsetenv("OMP_WAIT_POLICY");
  auto env = CpuPerformanceEnv();
  EXPECT_EQ(env["OMP_WAIT_POLICY"], "PASSIVE");
  setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
  env = CpuPerformanceEnv();
  EXPECT_EQ(env.count("OMP_WAIT_POLICY"), 0u);
  unsetenv("OMP_WAIT_POLICY");
}

// scripts/setup.sh installs tcmalloc; every rank must run with it.
TEST(LocalLauncher, EveryRankRunsWithTheAllocator) {
  ASSERT_NE(AllocatorLibrary("tcmalloc"), "")
      << "tcmalloc is not installed: scripts/setup.sh must install libtcmalloc-minimal4";
  ::testing::internal::CaptureStdout();
  const int code = Launch("allocator", 2);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 0);
  for (int r = 0; r < 2; ++r) {
    const std::string line = "rank " + std::to_string(r) + " allocator tcmalloc";
    EXPECT_NE(out.find(line), std::string::npos) << out;
  }
}

TEST(LocalLauncher, OneVariableTurnsTheAllocatorOff) {
  setenv("FSDP2_ALLOCATOR", "system", 1);
  ::testing::internal::CaptureStdout();
  const int code = Launch("allocator", 2);
  const std::string out = ::testing::internal::GetCapturedStdout();
  unsetenv("FSDP2_ALLOCATOR");
  EXPECT_EQ(code, 0);
  EXPECT_NE(out.find("rank 0 allocator system"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 allocator system"), std::string::npos) << out;
}

TEST(LocalLauncher, TheCallersPreloadIsKept) {
  const std::string library = AllocatorLibrary("tcmalloc");
  ASSERT_NE(library, "");
  EXPECT_EQ(RankPreload(""), library);
  EXPECT_EQ(RankPreload("/opt/x/libfoo.so"), library + ":/opt/x/libfoo.so");
  EXPECT_EQ(RankPreload(library + " /opt/x/libfoo.so"), library + " /opt/x/libfoo.so");
  setenv("FSDP2_ALLOCATOR", "system", 1);
  EXPECT_EQ(RankPreload("/opt/x/libfoo.so"), "/opt/x/libfoo.so");
  setenv("FSDP2_ALLOCATOR", "glibc", 1);
  try {
    RequestedAllocator();
    ADD_FAILURE() << "an unknown allocator was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("FSDP2_ALLOCATOR='glibc'"), std::string::npos)
        << e.what();
  }
  unsetenv("FSDP2_ALLOCATOR");
}

// Runs this binary as one rank of an outside launcher (torchrun, srun,
// mpirun: RANK set, nothing of CpuPerformanceEnv) in mode "reexec", with
// `env` changed by `edit`; returns what it printed.
std::string RunOutsideRank(const std::map<std::string, std::string>& edit, int* runs,
                           std::vector<std::string>* names = nullptr) {
  const std::string runs_file = ::testing::TempDir() + "/outside_rank_runs";
  std::remove(runs_file.c_str());
  auto env = CurrentEnvironment();
  env["FSDP2_TEST_RUNS_FILE"] = runs_file;
  for (const char* name : {"LD_PRELOAD", "OMP_WAIT_POLICY"}) env.erase(name);
  env["RANK"] = "0";
  env["WORLD_SIZE"] = "1";
  env["FSDP2_LAUNCHER_TEST_MODE"] = "reexec";
  for (const auto& [name, value] : edit) env[name] = value;
  int fds[2];
  if (pipe(fds) != 0) return "pipe() failed";
  const int pid = SpawnSelf({"local_launcher_test"}, env, fds[1]);
  close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t got; (got = read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, got);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) out += "\n(rank failed)";
  std::ifstream lines(runs_file);
  *runs = 0;
  for (std::string line; std::getline(lines, line);) {
    ++*runs;
    if (names != nullptr) names->push_back(line);
  }
  return out;
}

// Such a rank restarts itself once with everything a launched rank gets:
// the allocator, the OpenBLAS core type for this CPU and passive OpenMP
// waiting, and the restarted run does not see the marker of its restart.
TEST(LocalLauncher, AnOutsideRankRestartsWithTheRankEnvironment) {
  int runs = 0;
  std::vector<std::string> names;
  const std::string out = RunOutsideRank({}, &runs, &names);
  EXPECT_EQ(runs, 2) << "it should restart exactly once\n" << out;
  // Named after its binary before and after the restart (the kernel keeps
  // 15 characters), not "exe".
  for (const std::string& name : names) EXPECT_EQ(name, "local_launcher_") << out;
  const std::string expected = "rank 0 allocator tcmalloc wait policy PASSIVE marker (unset)";
  EXPECT_NE(out.find(expected), std::string::npos) << out;
}

// What the user set wins, and a process that has everything does not
// restart.
TEST(LocalLauncher, AnOutsideRankKeepsTheUsersChoices) {
  int runs = 0;
  const std::string out = RunOutsideRank(
      {{"OMP_WAIT_POLICY", "ACTIVE"}, {"FSDP2_ALLOCATOR", "system"}},
      &runs);
  EXPECT_EQ(runs, 1) << out;
  EXPECT_NE(out.find("rank 0 allocator system wait policy ACTIVE marker (unset)"),
            std::string::npos)
      << out;
}

TEST(LocalLauncher, CpuFlagsAreMatchedAsWholeWords) {
  EXPECT_TRUE(HasCpuFlag(" fma avx2 avx512f ", "avx512f"));
  EXPECT_TRUE(HasCpuFlag("fma avx2", "fma"));  // unpadded
  EXPECT_TRUE(HasCpuFlag("fma avx2", "avx2"));
  EXPECT_FALSE(HasCpuFlag(" avx512fp16 avx512_bf16 ", "avx512f"));
  EXPECT_FALSE(HasCpuFlag(" avx512_bf16 ", "bf16"));
  EXPECT_FALSE(HasCpuFlag(" ", "avx2"));
  EXPECT_TRUE(HasCpuFlag(CpuFlags(), "fpu") || CpuFlags() == " ");
}

TEST(LocalLauncher, ZeroProcessesIsAnError) {
  EXPECT_THROW(Launch("hello", 0), std::invalid_argument);
}

}  // namespace
}  // namespace launch
}  // namespace fsdp2

int main(int argc, char** argv) {
  const char* mode = std::getenv("FSDP2_LAUNCHER_TEST_MODE");
  if (mode != nullptr && fsdp2::launch::IsRankProcess()) {
    return fsdp2::launch::RankMain(mode, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
