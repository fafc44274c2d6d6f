// The communicators of a rank's groups (DP, TP, PP, the embedding group, the
// world) on its backend. On the CPU every buffer is host memory and MPI
// moves it. On a device backend each group's path is chosen once
// (comm.device, comm/device_comm.h) by every rank of the group alike: host
// staging (comm/staged_comm.h) wraps the group's MPI communicator, and host
// buffers (losses, norms) pass through it untouched.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

#include "comm/comm.h"
#include "comm/device_comm.h"
#include "comm/staged_comm.h"
#include "train/group_paths.h"

namespace meshlm {

// How a rank of a device backend moves its groups' buffers.
struct DeviceRoute {
  comm::DeviceComm asked = comm::DeviceComm::automatic;  // comm.device
  // Each group's path, comm.device resolved (train/group_paths.h).
  GroupPaths paths;
  // NCCL is comm/ordered_comm.h's emulation (the emulated device).
  bool nccl_emulated = false;
  const char* backend = "";  // runtime.backend, for messages
  comm::GpuSlot slot;        // the rank's node, GPU and world rank
  size_t staging_bytes = size_t(32) << 20;  // host staging's buffer, at most
  void* stream = nullptr;  // the GPU's compute stream, which NCCL's work follows
};

// A communicator over `group` (named `name` in messages) whose device
// buffers take `path`: host staging through `device` (how bytes cross
// between the device and the host; it must outlive the result), or NCCL
// after the work of `route.stream` (cuda/nccl_comm.h; its emulation through
// `device` where route.nccl_emulated, comm/ordered_comm.h). Collective over
// the group under nccl.
std::unique_ptr<comm::Communicator> make_group_communicator(MPI_Comm group, comm::DeviceComm path,
                                                            const comm::DeviceAccess& device,
                                                            const DeviceRoute& route,
                                                            const std::string& name);

}  // namespace meshlm
