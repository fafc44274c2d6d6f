#include "train/group_paths.h"

#include <fmt/format.h>

#include <vector>

#include "comm/errors.h"
#include "core/error.h"
#include "train/backend.h"

namespace meshlm {

const char* mesh_group_name(int group) {
  static const char* const kNames[kNumMeshGroups] = {"dp", "tp", "pp", "embedding", "world"};
  MESHLM_CHECK(group >= 0 && group < kNumMeshGroups, "a mesh group");
  return kNames[group];
}

int emulated_device_ordinal(int node_rank, int gpus_per_node) {
  return gpus_per_node > 0 ? comm::gpu_of(node_rank, gpus_per_node) : node_rank;
}

namespace {

// Whether comm.device = `asked` can take NCCL on `backend` (false: every
// group is host); a RankError where nccl is asked of a backend without it.
bool nccl_possible(ComputeBackend backend, comm::DeviceComm asked) {
  const BackendCaps& caps = backend_caps(backend);
  if (!caps.device_memory || asked == comm::DeviceComm::host) return false;
  if (caps.nccl) return true;
  if (asked == comm::DeviceComm::automatic) return false;
  throw RankError(std::string("comm.device = nccl: runtime.backend = ") + name_of(caps.kind) +
                      " has no NCCL path in this meshlm; set comm.device = host or auto",
                  MESHLM_HERE);
}

// Rank `rank`'s group of kind `g` in `layout` (sorted by world rank; empty
// where the rank is not in its embedding group).
std::vector<int> members_of(const MeshLayout& layout, int g, int rank) {
  switch (g) {
    case kGroupDp: return layout.dp_group(rank);
    case kGroupTp: return layout.tp_group(rank);
    case kGroupPp: return layout.pp_group(rank);
    case kGroupEmbedding: return layout.embedding_group(rank);
    default: break;
  }
  std::vector<int> world(static_cast<size_t>(layout.world()));
  for (int r = 0; r < layout.world(); ++r) world[static_cast<size_t>(r)] = r;
  return world;
}

// The path of the group `members` (of kind g, named for `rank`).
comm::DeviceComm resolve_group(comm::DeviceComm asked, int g, const std::vector<int>& members,
                               int rank, const std::function<comm::GpuSlot(int)>& slot_of) {
  // auto leaves a group of one rank (nothing moves) to the host path, which
  // then copies nothing: no NCCL communicator, no NCCL buffers.
  if (members.size() == 1 && asked == comm::DeviceComm::automatic) return comm::DeviceComm::host;
  std::vector<comm::GpuSlot> slots;
  slots.reserve(members.size());
  for (const int r : members) slots.push_back(slot_of(r));
  return comm::resolve_device_comm(
      asked, slots, fmt::format("the {} group of rank {}", mesh_group_name(g), rank));
}

}  // namespace

GroupPaths resolve_group_paths(ComputeBackend backend, comm::DeviceComm asked,
                               const ParallelConfig& p, int rank,
                               const std::function<comm::GpuSlot(int)>& slot_of) {
  GroupPaths paths;
  if (!nccl_possible(backend, asked)) return paths;
  const MeshLayout layout(p.dp, p.tp, p.pp);
  for (int g = 0; g < kNumMeshGroups; ++g) {
    const std::vector<int> members = members_of(layout, g, rank);
    if (!members.empty())
      paths.path[static_cast<size_t>(g)] = resolve_group(asked, g, members, rank, slot_of);
  }
  return paths;
}

std::vector<GroupPaths> resolve_every_rank_group_paths(
    ComputeBackend backend, comm::DeviceComm asked, const ParallelConfig& p,
    const std::function<comm::GpuSlot(int)>& slot_of) {
  const MeshLayout layout(p.dp, p.tp, p.pp);
  const size_t n = static_cast<size_t>(layout.world());
  std::vector<GroupPaths> all(n);
  if (!nccl_possible(backend, asked)) return all;
  // Each group once, by its lowest rank (its first member).
  for (int g = 0; g < kNumMeshGroups; ++g) {
    std::vector<int> done(n, -1);  // by first member: the path, as an int
    for (int r = 0; r < layout.world(); ++r) {
      const std::vector<int> members = members_of(layout, g, r);
      if (members.empty()) continue;
      int& d = done[static_cast<size_t>(members.front())];
      if (d < 0) d = static_cast<int>(resolve_group(asked, g, members, r, slot_of));
      all[static_cast<size_t>(r)].path[static_cast<size_t>(g)] = static_cast<comm::DeviceComm>(d);
      if (g == kGroupWorld) {  // one group: the same for every rank
        for (GroupPaths& q : all) q.path[kGroupWorld] = static_cast<comm::DeviceComm>(d);
        break;
      }
    }
  }
  return all;
}

GroupPaths gather_group_paths(const RunConfig& cfg, const ProcessMesh& mesh, int device_ordinal) {
  const std::vector<comm::GpuSlot> slots =
      comm::gather_slots(mesh.world(), {mesh.node_index(), device_ordinal, mesh.rank()});
  GroupPaths paths;
  try_all(mesh.world(), "", [&] {
    paths = resolve_group_paths(cfg.runtime.backend, cfg.comm.device, cfg.parallel, mesh.rank(),
                                [&](int r) { return slots.at(static_cast<size_t>(r)); });
  }, MESHLM_HERE);
  return paths;
}

std::string rank_group_paths(const GroupPaths& paths, const ProcessMesh& mesh) {
  std::string line;
  for (int g = 0; g < kNumMeshGroups; ++g) {
    if (g == kGroupEmbedding && mesh.embedding() == MPI_COMM_NULL) continue;
    line += fmt::format("{}{} {}", line.empty() ? "" : ", ", mesh_group_name(g),
                        paths.nccl(g) ? "nccl" : "host");
  }
  return line;
}

std::string describe_group_paths(const GroupPaths& paths, const ProcessMesh& mesh,
                                 comm::Communicator& world) {
  // 1 = host, 2 = nccl, 0 = not a member (3 in the minimum, which it must
  // not decide).
  const MPI_Comm groups[kNumMeshGroups] = {mesh.dp(), mesh.tp(), mesh.pp(), mesh.embedding(),
                                           mesh.world()};
  int most[kNumMeshGroups], least[kNumMeshGroups], mine[kNumMeshGroups], mine_or_3[kNumMeshGroups];
  for (int g = 0; g < kNumMeshGroups; ++g) {
    mine[g] = groups[g] == MPI_COMM_NULL ? 0 : paths.nccl(g) ? 2 : 1;
    mine_or_3[g] = mine[g] == 0 ? 3 : mine[g];
  }
  world.all_reduce(mine, most, kNumMeshGroups, DType::i32, comm::ReduceOp::max).wait();
  world.all_reduce(mine_or_3, least, kNumMeshGroups, DType::i32, comm::ReduceOp::min).wait();
  std::string line;
  for (int g = 0; g < kNumMeshGroups; ++g) {
    if (most[g] == 0) continue;
    const char* how =
        least[g] == most[g] ? (most[g] == 2 ? "nccl" : "host") : "nccl or host by group";
    line += fmt::format("{}{} {}", line.empty() ? "" : ", ", mesh_group_name(g), how);
  }
  return line;
}

}  // namespace meshlm
