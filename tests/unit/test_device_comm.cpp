// comm.device (comm/device_comm.h) and how the planner follows it
// (train/layout_search.h, device_comm_of): a rank's GPU is its node-local
// rank modulo the node's GPUs; auto gives NCCL to a group whose ranks each
// have a GPU and host staging to one where two share; nccl asked there is
// an error naming the two ranks, the GPU and the node; host is host.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/device_comm.h"
#include "core/error.h"
#include "train/layout_search.h"

using namespace meshlm;
using comm::DeviceComm;
using comm::GpuSlot;

TEST(DeviceComm, EachRankComputesOnItsNodeLocalRankModuloTheGpus) {
  EXPECT_EQ(comm::gpu_of(0, 8), 0);
  EXPECT_EQ(comm::gpu_of(7, 8), 7);
  EXPECT_EQ(comm::gpu_of(9, 8), 1);
  EXPECT_EQ(comm::gpu_of(3, 1), 0);
  EXPECT_THROW(comm::gpu_of(0, 0), RankError);
}

TEST(DeviceComm, AutoGivesNcclToOwnGpusAndHostToSharedOnes) {
  const std::vector<GpuSlot> own = {{0, 0, 0}, {0, 1, 1}, {1, 0, 8}, {1, 1, 9}};
  const std::vector<GpuSlot> shared = {{0, 0, 0}, {0, 1, 1}, {0, 0, 2}};
  EXPECT_EQ(comm::resolve_device_comm(DeviceComm::automatic, own, "g"), DeviceComm::nccl);
  EXPECT_EQ(comm::resolve_device_comm(DeviceComm::automatic, shared, "g"), DeviceComm::host);
  EXPECT_EQ(comm::resolve_device_comm(DeviceComm::host, own, "g"), DeviceComm::host);
  EXPECT_EQ(comm::resolve_device_comm(DeviceComm::nccl, own, "g"), DeviceComm::nccl);
  // GPU 0 of two nodes is two GPUs; a group of one has nothing to share.
  EXPECT_EQ(comm::resolve_device_comm(DeviceComm::nccl, std::vector<GpuSlot>{{0, 0, 0}, {1, 0, 8}}, "g"),
            DeviceComm::nccl);
  EXPECT_EQ(comm::resolve_device_comm(DeviceComm::nccl, std::vector<GpuSlot>{{0, 3, 5}}, "g"),
            DeviceComm::nccl);
  try {
    comm::resolve_device_comm(DeviceComm::nccl, shared, "the dp group of rank 0");
    FAIL() << "nccl on a shared GPU";
  } catch (const RankError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ranks 0 and 2 of the dp group of rank 0 share GPU 0 of node 0"), std::string::npos) << m;
    EXPECT_NE(m.find("comm.device = host"), std::string::npos) << m;
  }
}

namespace {

RunConfig layout(int dp, int tp, int pp, DeviceComm device) {
  RunConfig c;
  c.parallel.dp = dp;
  c.parallel.tp = tp;
  c.parallel.pp = pp;
  c.comm.device = device;
  return c;
}

PlanMachine gpus(int ranks, int ranks_per_node, int gpus_per_node) {
  PlanMachine m;
  m.ranks = ranks;
  m.ranks_per_node = ranks_per_node;
  m.backend = ComputeBackend::cuda;
  m.gpus_per_node = gpus_per_node;
  return m;
}

}  // namespace

// The planner's path for rank 0's groups: 16 ranks on nodes of 8 GPUs, 8 or
// 16 ranks a node; nothing on the CPU.
TEST(DeviceComm, ThePlannerStagesLayoutsWhoseGroupsShareAGpu) {
  EXPECT_EQ(device_comm_of(layout(16, 1, 1, DeviceComm::automatic), gpus(16, 8, 8)), "nccl");
  EXPECT_EQ(device_comm_of(layout(16, 1, 1, DeviceComm::automatic), gpus(16, 16, 8)), "host");
  // tp 2 x dp 4 x pp 2 with 16 a node: tp {0, 1}, dp {0, 2, 4, 6}, pp {0, 8}: 0 and 8 share GPU 0.
  EXPECT_EQ(device_comm_of(layout(4, 2, 2, DeviceComm::automatic), gpus(16, 16, 8)), "host");
  // tp 8 alone on a node of 8 GPUs of 16 ranks: its group has a GPU each.
  EXPECT_EQ(device_comm_of(layout(1, 8, 1, DeviceComm::automatic), gpus(8, 16, 8)), "nccl");
  EXPECT_EQ(device_comm_of(layout(16, 1, 1, DeviceComm::host), gpus(16, 8, 8)), "host");
  // The emulated device has no NCCL: every layout through the host.
  PlanMachine emulated = gpus(16, 8, 8);
  emulated.backend = ComputeBackend::emulated;
  EXPECT_EQ(device_comm_of(layout(16, 1, 1, DeviceComm::automatic), emulated), "host");
  EXPECT_THROW(device_comm_of(layout(16, 1, 1, DeviceComm::nccl), gpus(16, 16, 8)), CollectiveError);
  PlanMachine cpu = gpus(16, 16, 8);
  cpu.backend = ComputeBackend::cpu;
  EXPECT_EQ(device_comm_of(layout(16, 1, 1, DeviceComm::nccl), cpu), "");
}
