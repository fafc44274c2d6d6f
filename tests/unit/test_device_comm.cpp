// comm.device (comm/device_comm.h), resolved group by group for a rank
// (train/group_paths.h), and how the planner follows it
// (train/layout_search.h, device_comm_of, planned_group_paths): a rank's GPU
// is its node-local rank modulo the node's GPUs; auto gives NCCL to a group
// whose ranks each have a GPU and host staging to one where two share; nccl
// asked there is an error naming the two ranks, the GPU and the node; host
// is host.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/device_comm.h"
#include "core/error.h"
#include "train/group_paths.h"
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

PlanMachine gpus(int ranks, int ranks_per_node, int gpus_per_node,
                 ComputeBackend backend = ComputeBackend::cuda) {
  PlanMachine m;
  m.ranks = ranks;
  m.ranks_per_node = ranks_per_node;
  m.backend = backend;
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
  // The emulated device's NCCL (its emulation) by the same rule.
  PlanMachine emulated = gpus(16, 8, 8, ComputeBackend::emulated);
  EXPECT_EQ(device_comm_of(layout(16, 1, 1, DeviceComm::automatic), emulated), "nccl");
  emulated.gpus_per_node = 4;
  EXPECT_EQ(device_comm_of(layout(16, 1, 1, DeviceComm::automatic), emulated), "host");
  EXPECT_THROW(device_comm_of(layout(16, 1, 1, DeviceComm::nccl), gpus(16, 16, 8)), CollectiveError);
  PlanMachine cpu = gpus(16, 16, 8);
  cpu.backend = ComputeBackend::cpu;
  EXPECT_EQ(device_comm_of(layout(16, 1, 1, DeviceComm::nccl), cpu), "");
}

namespace {

// The paths of `rank`'s groups on nodes of `rpn` ranks and `g` GPUs each.
GroupPaths paths_of(const RunConfig& c, int rank, int rpn, int g) {
  return resolve_group_paths(c.runtime.backend, c.comm.device, c.parallel, rank, [&](int r) {
    return GpuSlot{r / rpn, comm::gpu_of(r % rpn, g), r};
  });
}

std::string text(const GroupPaths& p) {
  std::string s;
  for (int g = 0; g < kNumMeshGroups; ++g)
    s += std::string(g ? " " : "") + mesh_group_name(g) + "=" + (p.nccl(g) ? "nccl" : "host");
  return s;
}

RunConfig emulated(int dp, int tp, int pp, DeviceComm device) {
  RunConfig c = layout(dp, tp, pp, device);
  c.runtime.backend = ComputeBackend::emulated;
  return c;
}

}  // namespace

// Group by group: 8 ranks of dp 2 x tp 2 x pp 2 on one node of 4 GPUs
// (rank r on GPU r mod 4). Rank 0: tp {0, 1} and dp {0, 2} have a GPU each,
// pp {0, 4} and the embedding group {0, 4} share GPU 0, and so does the
// world. Rank 5: tp {4, 5} on GPUs 0 and 1, dp {5, 7} on 1 and 3, pp {1, 5}
// on 1 and 1.
TEST(GroupPaths, AutoResolvesEachGroupOfTheRankOnItsOwn) {
  const RunConfig c = emulated(2, 2, 2, DeviceComm::automatic);
  EXPECT_EQ(text(paths_of(c, 0, 8, 4)), "dp=nccl tp=nccl pp=host embedding=host world=host");
  EXPECT_EQ(text(paths_of(c, 5, 8, 4)), "dp=nccl tp=nccl pp=host embedding=host world=host");
  // A GPU per rank: NCCL everywhere; two nodes of 4 ranks on 4 GPUs each
  // likewise (GPU 0 of node 0 and of node 1 are two GPUs).
  EXPECT_EQ(text(paths_of(c, 0, 8, 8)), "dp=nccl tp=nccl pp=nccl embedding=nccl world=nccl");
  EXPECT_EQ(text(paths_of(c, 6, 4, 4)), "dp=nccl tp=nccl pp=nccl embedding=nccl world=nccl");
  // One GPU for the node: every group of more than one rank staged; a
  // group of one (tp 1) moves nothing and stays on the host path under
  // auto (no NCCL communicator), but takes NCCL when it is asked for.
  EXPECT_EQ(text(paths_of(emulated(4, 1, 2, DeviceComm::automatic), 3, 8, 1)),
            "dp=host tp=host pp=host embedding=host world=host");
  EXPECT_EQ(text(paths_of(emulated(1, 1, 4, DeviceComm::automatic), 1, 4, 4)),
            "dp=host tp=host pp=nccl embedding=host world=nccl");
  EXPECT_EQ(text(paths_of(emulated(1, 1, 4, DeviceComm::nccl), 0, 4, 4)),
            "dp=nccl tp=nccl pp=nccl embedding=nccl world=nccl");
  // A rank outside the embedding group (a middle stage) keeps host there.
  EXPECT_EQ(text(paths_of(emulated(1, 1, 4, DeviceComm::nccl), 1, 4, 4)),
            "dp=nccl tp=nccl pp=nccl embedding=host world=nccl");
  // One rank: nothing but groups of one, no NCCL under auto.
  EXPECT_EQ(text(paths_of(emulated(1, 1, 1, DeviceComm::automatic), 0, 1, 1)),
            "dp=host tp=host pp=host embedding=host world=host");
  // comm.device = host: host; the CPU: host (MPI moves its buffers).
  EXPECT_EQ(text(paths_of(emulated(2, 2, 2, DeviceComm::host), 0, 8, 8)),
            "dp=host tp=host pp=host embedding=host world=host");
  RunConfig cpu = layout(2, 2, 2, DeviceComm::nccl);
  EXPECT_EQ(text(paths_of(cpu, 0, 8, 1)), "dp=host tp=host pp=host embedding=host world=host");
}

TEST(GroupPaths, NcclOnAGroupThatSharesAGpuNamesIt) {
  try {
    paths_of(emulated(2, 2, 2, DeviceComm::nccl), 4, 8, 4);
    FAIL() << "nccl on a shared GPU";
  } catch (const RankError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ranks 0 and 4 of the pp group of rank 4 share GPU 0 of node 0"),
              std::string::npos) << m;
  }
  // The planner's error is every rank's (a CollectiveError).
  PlanMachine m = gpus(8, 8, 4, ComputeBackend::emulated);
  EXPECT_THROW(planned_group_paths(emulated(2, 2, 2, DeviceComm::nccl), m, 4), CollectiveError);
}

// The planner's paths are train's for every rank of the layout (the same
// rule on the same slots), and device_comm_of reads rank 0's.
TEST(GroupPaths, ThePlannerResolvesEveryRankAsTrainDoes) {
  const RunConfig c = emulated(2, 2, 2, DeviceComm::automatic);
  PlanMachine m = gpus(8, 8, 4, ComputeBackend::emulated);
  const std::vector<GroupPaths> every = planned_every_rank_group_paths(c, m);
  ASSERT_EQ(every.size(), 8u);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(text(planned_group_paths(c, m, r)), text(paths_of(c, r, 8, 4))) << "rank " << r;
    EXPECT_EQ(text(every[static_cast<size_t>(r)]), text(paths_of(c, r, 8, 4))) << "rank " << r;
  }
  EXPECT_EQ(device_comm_of(c, m), "host");
  m.gpus_per_node = 8;
  EXPECT_EQ(device_comm_of(c, m), "nccl");
  // Groups of one rank (tp 1, pp 1) are on the host path and move nothing:
  // the layout is NCCL's.
  EXPECT_EQ(device_comm_of(emulated(8, 1, 1, DeviceComm::automatic), m), "nccl");
}

// Each group resolved once, and a group's GPUs compared in n log n: every
// rank of 4096 (dp 64 x tp 8 x pp 8 on nodes of 8 GPUs, one rank a GPU)
// with NCCL everywhere; on nodes of 16 ranks every tp group is NCCL's
// (ranks r and r + 8 of a node share a GPU, never one tp group) and every
// dp group staged (r and r + 8 are neighbours in dp).
TEST(GroupPaths, EveryRankOfALargeJobAtOnce) {
  const RunConfig c = emulated(64, 8, 8, DeviceComm::automatic);
  PlanMachine m = gpus(4096, 8, 8, ComputeBackend::emulated);
  const std::vector<GroupPaths> own = planned_every_rank_group_paths(c, m);
  ASSERT_EQ(own.size(), 4096u);
  for (size_t r = 0; r < own.size(); ++r) {
    const bool end_stage = r < 512 || r >= 4096 - 512;  // in an embedding group
    ASSERT_TRUE(own[r].nccl(kGroupDp) && own[r].nccl(kGroupTp) && own[r].nccl(kGroupPp) &&
                own[r].nccl(kGroupWorld) && own[r].nccl(kGroupEmbedding) == end_stage)
        << r << ": " << text(own[r]);
  }
  m.ranks_per_node = 16;
  const std::vector<GroupPaths> shared = planned_every_rank_group_paths(c, m);
  for (size_t r = 0; r < shared.size(); ++r) {
    ASSERT_TRUE(shared[r].nccl(kGroupTp)) << r;
    ASSERT_FALSE(shared[r].nccl(kGroupDp)) << r;
    ASSERT_FALSE(shared[r].nccl(kGroupWorld)) << r;
  }
  EXPECT_EQ(text(shared[4095]), text(planned_group_paths(c, m, 4095)));
}

TEST(GroupPaths, TheEmulatedDeviceNumbersGpusAsCudaDoes) {
  EXPECT_EQ(emulated_device_ordinal(5, 0), 5);  // a GPU per rank
  EXPECT_EQ(emulated_device_ordinal(5, 4), 1);
  EXPECT_EQ(emulated_device_ordinal(3, 1), 0);
}
