#include "comm/device_comm.h"

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
  for (size_t i = 0; i < group.size(); ++i)
    for (size_t j = i + 1; j < group.size(); ++j) {
      if (group[i].node != group[j].node || group[i].gpu != group[j].gpu) continue;
      if (asked == DeviceComm::automatic) return DeviceComm::host;
      throw RankError("comm.device = nccl: ranks " + std::to_string(group[i].rank) + " and " +
                          std::to_string(group[j].rank) + " of " + name + " share GPU " +
                          std::to_string(group[i].gpu) + " of node " +
                          std::to_string(group[i].node) +
                          ", and NCCL refuses two ranks on one GPU; set comm.device = host, or "
                          "auto, which stages such groups through the host",
                      MESHLM_HERE);
    }
  return DeviceComm::nccl;
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
