// comm.device resolved for each of a rank's groups: whether the group moves
// a device backend's buffers by NCCL (GPU to GPU) or stages them through the
// host (comm/staged_comm.h). auto takes NCCL for a group of two or more
// ranks that each have a GPU of their own, and the host for one in which two
// ranks share a GPU, group by group: on a node of 4 GPUs and 8 ranks, a tp
// group of ranks 0 and 1 (GPUs 0 and 1) is NCCL's while the dp group of
// ranks 0 and 4 (both on GPU 0) is staged. A group of one rank moves nothing:
// auto leaves it on the host path (no NCCL communicator for it), so a run of
// one rank per GPU-less group, and a run of one rank, opens no NCCL at all. train, its memory prediction and meshlm plan all take
// their paths from resolve_group_paths, so that they agree.
#pragma once

#include <mpi.h>

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/device_comm.h"
#include "mesh/mesh.h"
#include "train/run_config.h"

namespace meshlm {

// A rank's groups (mesh/mesh.h): data, tensor and pipeline parallel, the
// tied embedding's first and last stage, and every rank of the job.
enum MeshGroup : int { kGroupDp, kGroupTp, kGroupPp, kGroupEmbedding, kGroupWorld, kNumMeshGroups };
const char* mesh_group_name(int group);

struct GroupPaths {
  // Each group's path; host for a group the rank is not in, and on a backend
  // without device memory (the CPU's buffers are host memory: MPI moves them).
  std::array<comm::DeviceComm, kNumMeshGroups> path{
      comm::DeviceComm::host, comm::DeviceComm::host, comm::DeviceComm::host,
      comm::DeviceComm::host, comm::DeviceComm::host};
  bool nccl(int group) const { return path[static_cast<size_t>(group)] == comm::DeviceComm::nccl; }
};

// The emulated device's GPU of the node-local rank `node_rank`: modulo
// `gpus_per_node` (cluster.gpus_per_node), as cuda's ranks take the node's
// devices (cuda/context.h); a GPU per rank when it is 0.
int emulated_device_ordinal(int node_rank, int gpus_per_node);

// Pure: the paths of world rank `rank`'s groups in the layout `p` on
// `backend`, comm.device = `asked`, where rank r computes at slot_of(r) (its
// node and GPU). host: host; nccl or auto on a backend without NCCL: host
// under auto, a RankError under nccl; otherwise comm/device_comm.h's rule
// per group (nccl on a group in which two ranks share a GPU: a RankError
// naming the group, the ranks and the GPU), but auto's groups of one rank
// are host. All host on a backend without device memory.
GroupPaths resolve_group_paths(ComputeBackend backend, comm::DeviceComm asked,
                               const ParallelConfig& p, int rank,
                               const std::function<comm::GpuSlot(int)>& slot_of);

// The same for every rank of the layout at once, each group resolved once
// (the planner's: a world of thousands of ranks in every layout it weighs);
// element r is rank r's.
std::vector<GroupPaths> resolve_every_rank_group_paths(
    ComputeBackend backend, comm::DeviceComm asked, const ParallelConfig& p,
    const std::function<comm::GpuSlot(int)>& slot_of);

// Collective over the mesh's world: every rank's slot (its node, and GPU
// `device_ordinal` there) gathered, then resolve_group_paths for this rank.
// A refusal on any rank is every rank's error.
GroupPaths gather_group_paths(const RunConfig& cfg, const ProcessMesh& mesh, int device_ordinal);

// This rank's groups and their paths, for its rank line: "dp host, tp nccl,
// pp nccl, world host" (the embedding group where the rank is in it).
std::string rank_group_paths(const GroupPaths& paths, const ProcessMesh& mesh);

// One line for the run's report: each group's path over every rank
// ("dp nccl, tp host, pp nccl or host by group, ..."); collective over
// `world`, the mesh's world (whose host buffers any path passes through).
std::string describe_group_paths(const GroupPaths& paths, const ProcessMesh& mesh,
                                 comm::Communicator& world);

}  // namespace meshlm
