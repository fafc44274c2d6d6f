// comm.device = nccl: a comm::Communicator whose device buffers NCCL moves
// GPU to GPU, one NCCL communicator per group of the mesh.
//
// Made collectively over the group's host Communicator (MPI), which
// broadcasts rank 0's ncclUniqueId and stays inside for host buffers: a
// buffer NCCL cannot take (host memory: losses, norms, counts) goes to MPI as
// it is, as under host staging. The NCCL operations run on a stream of the
// communicator's own, after the work queued on the compute stream (an event
// recorded there and waited on the NCCL stream), so a reduction starts when
// the kernels that wrote its buffer have run, and the host is free
// meanwhile. A Handle's wait() blocks the host until the operation is done
// (cudaEventSynchronize): the engine then issues the kernels that read the
// result. Point-to-point sends and receives of one step (a pipeline) go on
// two Communicators, as the engine makes them, each with its stream.
//
// A failed NCCL call is a RankError naming the group, the rank and the
// operation, with NCCL's own detail. A wait polls its operation's event: the
// stall watchdog (comm/stall_watchdog.h) names the operation and the group's
// ranks when it stops, and aborts the NCCL communicator before it ends the
// job; an error NCCL reports while a rank waits ends the wait with it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace meshlm::cuda {

// Collective over `host` (every rank of its group calls it, each on its own
// GPU: the current device). `compute` is the cudaStream_t the rank's kernels
// run on (must outlive the result); `name` names the group in messages ("the
// dp group of rank 4"), `members` its world ranks (the stall watchdog's).
std::unique_ptr<comm::Communicator> make_nccl_communicator(
    std::unique_ptr<comm::Communicator> host, void* compute, const std::string& name,
    std::vector<int> members);

}  // namespace meshlm::cuda
