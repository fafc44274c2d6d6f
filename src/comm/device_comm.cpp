#include "comm/device_comm.h"

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

}  // namespace meshlm::comm
