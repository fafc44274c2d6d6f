#include "comm/device_comm.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace meshlm::comm {

int gpu_of(int node_rank, int gpus_per_node) {
  MESHLM_CHECK(gpus_per_node >= 1 && node_rank >= 0, "a node has GPUs and a rank has a place on it");
  return node_rank % gpus_per_node;
}

DeviceComm resolve_device_comm(DeviceComm asked, std::span<const GpuSlot> group,
                               const std::string& name) {
  if (asked == DeviceComm::host) return DeviceComm::host;
  // The group's members by (node, GPU), then by their place in the group:
  // two that share a GPU are neighbours (n log n: a world group of
  // thousands of ranks is resolved for every layout the planner weighs).
  std::vector<size_t> order(group.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const GpuSlot &x = group[a], &y = group[b];
    return std::tie(x.node, x.gpu, a) < std::tie(y.node, y.gpu, b);
  });
  // The first member (in group order) that shares its GPU with a later one,
  // and the first of those later ones.
  size_t first = group.size(), second = 0;
  for (size_t k = 1; k < order.size(); ++k) {
    const GpuSlot &x = group[order[k - 1]], &y = group[order[k]];
    if (x.node != y.node || x.gpu != y.gpu) continue;
    if (k >= 2 && group[order[k - 2]].node == x.node && group[order[k - 2]].gpu == x.gpu) continue;
    if (order[k - 1] < first) {
      first = order[k - 1];
      second = order[k];
    }
  }
  if (first == group.size()) return DeviceComm::nccl;
  if (asked == DeviceComm::automatic) return DeviceComm::host;
  throw RankError("comm.device = nccl: ranks " + std::to_string(group[first].rank) + " and " +
                      std::to_string(group[second].rank) + " of " + name + " share GPU " +
                      std::to_string(group[first].gpu) + " of node " +
                      std::to_string(group[first].node) +
                      ", and NCCL refuses two ranks on one GPU; set comm.device = host, or "
                      "auto, which stages such groups through the host",
                  MESHLM_HERE);
}

std::vector<GpuSlot> gather_slots(MPI_Comm comm, const GpuSlot& mine) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<GpuSlot> slots(static_cast<size_t>(size));
  MPI_Allgather(&mine, sizeof(GpuSlot), MPI_BYTE, slots.data(), sizeof(GpuSlot), MPI_BYTE, comm);
  return slots;
}

DeviceComm group_device_comm(MPI_Comm group, DeviceComm asked, bool nccl_built,
                             const char* backend, const GpuSlot& slot, const std::string& name) {
  const std::vector<GpuSlot> slots = gather_slots(group, slot);
  const DeviceComm path = resolve_device_comm(asked, slots, name);
  if (path != DeviceComm::nccl || nccl_built) return path;
  if (asked == DeviceComm::automatic) return DeviceComm::host;
  throw RankError(std::string("comm.device = nccl: runtime.backend = ") + backend +
                      " has no NCCL path in this meshlm (" + name +
                      "); set comm.device = host or auto",
                  MESHLM_HERE);
}

}  // namespace meshlm::comm
