// The launcher runs this binary as ranks; what each rank does is chosen by
// FSDP2_LAUNCHER_TEST_MODE.
#include "core/launch/local_launcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

namespace fsdp2 {
namespace launch {
namespace {

int RankMain(const std::string& mode) {
  const int rank = std::atoi(std::getenv("RANK"));
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

// The defaults the ranks get for fast, lean CPU training, each only where
// the caller has not set the variable.
TEST(LocalLauncher, PerformanceDefaultsYieldToTheCallersEnvironment) {
  unsetenv("MALLOC_MMAP_THRESHOLD_");
  unsetenv("OMP_WAIT_POLICY");
  auto env = CpuPerformanceEnv();
  EXPECT_EQ(env["MALLOC_MMAP_THRESHOLD_"], "4194304");
  EXPECT_EQ(env["OMP_WAIT_POLICY"], "PASSIVE");
  setenv("MALLOC_MMAP_THRESHOLD_", "131072", 1);
  setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
  env = CpuPerformanceEnv();
  EXPECT_EQ(env.count("MALLOC_MMAP_THRESHOLD_"), 0u);
  EXPECT_EQ(env.count("OMP_WAIT_POLICY"), 0u);
  unsetenv("MALLOC_MMAP_THRESHOLD_");
  unsetenv("OMP_WAIT_POLICY");
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
    return fsdp2::launch::RankMain(mode);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
