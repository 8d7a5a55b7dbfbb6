#include "core/strategy/cluster_environment.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace fsdp2 {
namespace strategy {
namespace {

ClusterEnvironment DetectFrom(const std::map<std::string, std::string>& vars) {
  return ClusterEnvironment::Detect([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(ClusterEnvironment, NothingSetIsOneLocalProcess) {
  auto c = DetectFrom({});
  EXPECT_EQ(c.kind, ClusterKind::kLocal);
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.world_size, 1);
}

TEST(ClusterEnvironment, Torchrun) {
  auto c = DetectFrom({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                       {"GROUP_RANK", "2"}, {"MASTER_ADDR", "10.0.0.7"},
                       {"MASTER_PORT", "29400"}});
  EXPECT_EQ(c.kind, ClusterKind::kTorchElastic);
  EXPECT_EQ(c.rank, 5);
  EXPECT_EQ(c.world_size, 8);
  EXPECT_EQ(c.local_rank, 1);
  EXPECT_EQ(c.node_rank, 2);
  EXPECT_EQ(c.master_addr, "10.0.0.7");
  EXPECT_EQ(c.master_port, 29400);
  auto r = c.ToRendezvous(std::chrono::seconds(7), comm::Backend::kGloo);
  EXPECT_TRUE(r.store_path.empty());
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.master_addr, "10.0.0.7");
  EXPECT_EQ(r.timeout, std::chrono::seconds(7));
}

TEST(ClusterEnvironment, Slurm) {
  auto c = DetectFrom({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"},
                       {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"},
                       {"SLURM_JOB_NODELIST", "gpu[03-04],cpu1"},
                       {"SLURM_JOB_ID", "123456"}});
  EXPECT_EQ(c.kind, ClusterKind::kSlurm);
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.local_rank, 1);
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_EQ(c.master_addr, "gpu03");
  EXPECT_EQ(c.master_port, 15000 + 123456 % 5000);
}

TEST(ClusterEnvironment, SlurmMasterAddrOverride) {
  auto c = DetectFrom({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                       {"SLURM_NODELIST", "n1"}, {"MASTER_ADDR", "head"},
                       {"MASTER_PORT", "1234"}});
  EXPECT_EQ(c.master_addr, "head");
  EXPECT_EQ(c.master_port, 1234);
}

TEST(ClusterEnvironment, OpenMPI) {
  auto c = DetectFrom({{"OMPI_COMM_WORLD_RANK", "2"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(c.kind, ClusterKind::kOpenMPI);
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.local_rank, 2);
  EXPECT_EQ(c.master_addr, "127.0.0.1");
}

TEST(ClusterEnvironment, OpenMPIAcrossNodesNeedsMasterAddr) {
  std::map<std::string, std::string> vars = {
      {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "8"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  EXPECT_THROW(DetectFrom(vars), std::invalid_argument);
  vars["MASTER_ADDR"] = "host0";
  auto c = DetectFrom(vars);
  EXPECT_EQ(c.master_addr, "host0");
  EXPECT_EQ(c.node_rank, 0);
}

TEST(ClusterEnvironment, BadValuesNameTheVariable) {
  try {
    DetectFrom({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='x'"), std::string::npos);
  }
  EXPECT_THROW(DetectFrom({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
               std::invalid_argument);
  EXPECT_THROW(DetectFrom({{"RANK", "0"}}), std::invalid_argument);
  EXPECT_THROW(DetectFrom({{"RANK", "0"}, {"WORLD_SIZE", "1"},
                           {"MASTER_PORT", "70000"}}),
               std::invalid_argument);
}

TEST(ClusterEnvironment, StorePathSelectsAFileStore) {
  auto c = DetectFrom({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"FSDP2_STORE_PATH", "/tmp/x"}});
  EXPECT_EQ(c.ToRendezvous(std::chrono::seconds(1), comm::Backend::kGloo).store_path, "/tmp/x");
}

TEST(ClusterEnvironment, FirstSlurmHost) {
  EXPECT_EQ(FirstSlurmHost("node7"), "node7");
  EXPECT_EQ(FirstSlurmHost("a1,a2"), "a1");
  EXPECT_EQ(FirstSlurmHost("gpu[12,15-16],x"), "gpu12");
  EXPECT_EQ(FirstSlurmHost("gpu[003-009]"), "gpu003");
}

TEST(ClusterEnvironment, RanksPerHostGroupsConsecutiveRanksOfOneHost) {
  EXPECT_EQ(RanksPerHost({"a/1"}), 1);
  EXPECT_EQ(RanksPerHost({"a/1", "a/1", "a/1"}), 3);
  EXPECT_EQ(RanksPerHost({"a/1", "a/1", "b/1", "b/1"}), 2);
  EXPECT_EQ(RanksPerHost({"a/1", "b/1", "c/1"}), 1);
  // Same name, another boot: another host.
  EXPECT_EQ(RanksPerHost({"a/1", "a/2"}), 1);
}

TEST(ClusterEnvironment, RanksPerHostRefusesUnevenOrInterleavedHosts) {
  try {
    RanksPerHost({"a/1", "a/1", "b/1"});
    ADD_FAILURE() << "uneven hosts accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("different numbers of ranks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shard_group_size"), std::string::npos) << e.what();
  }
  try {
    RanksPerHost({"a/1", "b/1", "a/1", "b/1"});
    ADD_FAILURE() << "interleaved hosts accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not consecutive"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strategy
}  // namespace fsdp2
