// Several FSDP2Strategy objects in one process (a notebook, a sweep): a
// second strategy created while the first lives, and a third after both
// are gone (their models still held, as a notebook's variables hold them),
// each train exactly as the first did; the first still trains after the
// second joined. On one rank with no launcher at all (the notebook), and
// on 2 ranks meeting at MASTER_ADDR:MASTER_PORT, where rank 0 serves the
// rendezvous store for all of them.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/strategy/fsdp2_strategy.h"
#include "tests/harness/multi_process.h"
#include "tests/strategy_util.h"

namespace fsdp2 {
namespace testing {
namespace {

constexpr uint64_t kSeed = 5;
constexpr int64_t kRows = 48;
constexpr int64_t kGlobalBatch = 8;

strategy::Batch Data() { return TokenWindows(TinyGPT().vocab_size, kRows); }

// A strategy joined to the job with a fresh GPT, parallelized.
struct Run {
  Run() : strategy(std::make_unique<strategy::FSDP2Strategy>(TestStrategyOptions(kSeed, 3))) {
    strategy->setup_environment();  // seeds every rank alike
    module = TestGPTModule();
    strategy->connect(module);
    strategy->parallelize();
    loader = std::make_unique<strategy::DataLoader>(
        strategy->process_dataloader(Data(), kGlobalBatch));
  }
  // The mean loss over ranks of step `i` (global batch i).
  double Step(int i) {
    at::Tensor loss = strategy->training_step(loader->batch(i), i);
    strategy->backward(loss);
    strategy->optimizer_step();
    return strategy->reduce(loss).item<double>();
  }
  std::unique_ptr<strategy::FSDP2Strategy> strategy;
  std::shared_ptr<models::GPTModule> module;
  std::unique_ptr<strategy::DataLoader> loader;
};

// Writes, one line each: the first strategy's 3 losses, the second's 2
// (made while the first lives), the third's 3 (made after both are gone).
FSDP2_SCENARIO(strategies_in_one_process) {
  std::vector<double> first, second, third;
  std::shared_ptr<models::GPTModule> kept;  // a notebook still holds its model
  {
    Run a;
    first.push_back(a.Step(0));
    first.push_back(a.Step(1));
    Run b;
    second.push_back(b.Step(0));
    second.push_back(b.Step(1));
    first.push_back(a.Step(2));
    kept = a.module;
  }
  Run c;
  for (int i = 0; i < 3; ++i) third.push_back(c.Step(i));
  std::ofstream out(WorkerOutDir() + "/losses" + std::to_string(c.strategy->world()->rank()) +
                    ".txt");
  out.precision(17);
  for (const auto* run : {&first, &second, &third}) {
    for (double v : *run) out << v << " ";
    out << "\n";
  }
}

// A TCP port nobody listens on now.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("no free port");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

void ExpectEveryStrategyTrainsAlike(int world, const std::map<std::string, std::string>& env) {
  LaunchOptions options;
  options.world_size = world;
  options.scenario = "strategies_in_one_process";
  options.timeout = std::chrono::seconds(240);
  options.env = env;
  LaunchResult r = LaunchRanks(options);
  ASSERT_TRUE(r.ok()) << r.Describe();
  for (int rank = 0; rank < world; ++rank) {
    const std::vector<double> v =
        ReadNumbers(r.out_dir + "/losses" + std::to_string(rank) + ".txt");
    ASSERT_EQ(v.size(), 8u) << "rank " << rank;
    const std::vector<double> first(v.begin(), v.begin() + 3), second(v.begin() + 3, v.begin() + 5),
        third(v.begin() + 5, v.end());
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(second[i], first[i]) << "N=" << world << " rank " << rank << " step " << i
                                     << ": the second strategy (the first alive) differs";
    }
    EXPECT_EQ(third, first) << "N=" << world << " rank " << rank
                            << ": the third strategy (after both) differs";
    EXPECT_LT(first[2], first[0]) << "the first strategy stopped learning";
  }
}

TEST(SecondStrategy, OneRankWithoutALauncherAsInANotebook) {
  // No launcher variables at all: the default MASTER_PORT would be bound
  // by each strategy's store if a rank of one used a TCP store.
  ExpectEveryStrategyTrainsAlike(
      1, {{"RANK", ""}, {"WORLD_SIZE", ""}, {"LOCAL_RANK", ""}, {"FSDP2_STORE_PATH", ""}});
}

TEST(SecondStrategy, TwoRanksMeetingOverTcp) {
  ExpectEveryStrategyTrainsAlike(2, {{"FSDP2_STORE_PATH", ""},
                                     {"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", std::to_string(FreePort())}});
}

TEST(SecondStrategy, TwoRanksMeetingThroughAFileStore) {
  ExpectEveryStrategyTrainsAlike(2, {});
}

}  // namespace
}  // namespace testing
}  // namespace fsdp2

int main(int argc, char** argv) { return fsdp2::testing::TestMain(argc, argv); }
