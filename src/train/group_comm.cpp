#include "train/group_comm.h"

#include "comm/mpi_comm.h"
#include "comm/ordered_comm.h"
#include "core/error.h"
#ifdef MESHLM_HAVE_CUDA
#include "cuda/nccl_comm.h"
#endif

namespace meshlm {

std::unique_ptr<comm::Communicator> make_group_communicator(MPI_Comm group, comm::DeviceComm path,
                                                            const comm::DeviceAccess& device,
                                                            const DeviceRoute& route,
                                                            const std::string& name) {
  std::unique_ptr<comm::Communicator> mpi = comm::make_mpi_communicator(group);
  if (path == comm::DeviceComm::nccl && route.nccl_emulated)
    return comm::make_ordered_communicator(std::move(mpi), group, device, name);
  if (path == comm::DeviceComm::nccl) {
#ifdef MESHLM_HAVE_CUDA
    return cuda::make_nccl_communicator(std::move(mpi), route.stream, name,
                                        comm::world_ranks_of(group));
#else
    throw RankError("comm.device = nccl for " + name + ": this meshlm was built without CUDA",
                    MESHLM_HERE);
#endif
  }
  MESHLM_CHECK(path == comm::DeviceComm::host, "a group's device path is resolved before use");
  return comm::make_staged_communicator(std::move(mpi), device, route.staging_bytes);
}

}  // namespace meshlm
