#include "train/group_comm.h"

#include <vector>

#include "comm/mpi_comm.h"
#include "core/error.h"

namespace meshlm {

comm::DeviceComm group_path(MPI_Comm group, const DeviceRoute& route, const std::string& name) {
  int size = 1;
  MPI_Comm_size(group, &size);
  std::vector<comm::GpuSlot> slots(static_cast<size_t>(size));
  MPI_Allgather(&route.slot, sizeof(comm::GpuSlot), MPI_BYTE, slots.data(), sizeof(comm::GpuSlot),
                MPI_BYTE, group);
  const comm::DeviceComm path = comm::resolve_device_comm(route.asked, slots, name);
  if (path != comm::DeviceComm::nccl || route.nccl) return path;
  if (route.asked == comm::DeviceComm::automatic) return comm::DeviceComm::host;
  throw RankError(std::string("comm.device = nccl: runtime.backend = ") + route.backend +
                      " has no NCCL path in this meshlm (" + name +
                      "); set comm.device = host or auto",
                  MESHLM_HERE);
}

std::unique_ptr<comm::Communicator> make_group_communicator(MPI_Comm group, comm::DeviceComm path,
                                                            const comm::DeviceAccess& device,
                                                            size_t staging_bytes) {
  std::unique_ptr<comm::Communicator> mpi = comm::make_mpi_communicator(group);
  MESHLM_CHECK(path == comm::DeviceComm::host, "a group's device path is resolved before use");
  return comm::make_staged_communicator(std::move(mpi), device, staging_bytes);
}

}  // namespace meshlm
