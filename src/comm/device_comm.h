// comm.device: how a CUDA backend's device buffers move between the ranks of
// a group (a DP, TP or PP group of the mesh). NCCL moves them GPU to GPU but
// refuses two ranks on one GPU ("Duplicate GPU detected"); host staging
// (comm/staged_comm.h) copies them through host memory and MPI, which any
// ranks can do. A rank computes on the GPU of its node-local rank modulo its
// node's GPUs (runtime.backend = cuda), so whether two ranks of a group
// share a GPU is known from the mesh alone, before any GPU is opened.
#pragma once

#include <mpi.h>

#include <span>
#include <string>
#include <vector>

#include "core/enum_names.h"

namespace meshlm::comm {

enum class DeviceComm {
  automatic,  // nccl for a group whose ranks each have a GPU of their own, host otherwise
  nccl,
  host,
};
inline constexpr EnumName<DeviceComm> kDeviceCommNames[] = {
    {DeviceComm::automatic, "auto"},
    {DeviceComm::nccl, "nccl"},
    {DeviceComm::host, "host"},
};
constexpr std::span<const EnumName<DeviceComm>> enum_names(DeviceComm) { return kDeviceCommNames; }

// Where a rank computes: its node, and the GPU it uses there; `rank` is its
// world rank, for messages.
struct GpuSlot {
  int node = 0, gpu = 0, rank = 0;
};

// The GPU of the node-local rank `node_rank` on a node of `gpus_per_node`
// GPUs (>= 1).
int gpu_of(int node_rank, int gpus_per_node);

// The path of one group, its ranks' `slots` in group order: `asked` when it is
// nccl or host; under auto, nccl when no two ranks share a slot, else host.
// nccl asked for a group in which two ranks share a GPU is a RankError
// naming `group` (e.g. "the dp group of rank 4"), the two ranks, the GPU
// and its node, and what to set instead. Never automatic.
DeviceComm resolve_device_comm(DeviceComm asked, std::span<const GpuSlot> slots,
                               const std::string& group);

// Collective over `comm`: every rank's slot (`mine` on each), in rank order.
std::vector<GpuSlot> gather_slots(MPI_Comm comm, const GpuSlot& mine);

// Collective over `group` (an MPI communicator): its path, the same on
// every rank of the group, from each rank's `slot` gathered over it.
// `nccl_built`: whether the backend (`backend`, for messages) can move
// device buffers with NCCL; without it auto is host and nccl a RankError.
DeviceComm group_device_comm(MPI_Comm group, DeviceComm asked, bool nccl_built,
                             const char* backend, const GpuSlot& slot, const std::string& name);

}  // namespace meshlm::comm
