#include "train/group_comm.h"

#include "comm/mpi_comm.h"
#include "core/error.h"

namespace meshlm {

std::unique_ptr<comm::Communicator> make_group_communicator(MPI_Comm group, comm::DeviceComm path,
                                                            const comm::DeviceAccess& device,
                                                            size_t staging_bytes) {
  std::unique_ptr<comm::Communicator> mpi = comm::make_mpi_communicator(group);
  MESHLM_CHECK(path == comm::DeviceComm::host, "a group's device path is resolved before use");
  return comm::make_staged_communicator(std::move(mpi), device, staging_bytes);
}

}  // namespace meshlm
