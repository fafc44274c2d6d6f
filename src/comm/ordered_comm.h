// NCCL's ordering, without a GPU: a Communicator for device buffers whose
// operations run as NCCL's run on a communicator's stream. Each starts only
// when the one issued before it on the same Communicator has completed, and
// each advances while the rank does other work or waits on another
// Communicator. So a receive issued after a send waits until the peer has
// taken the send, and collectives issued in different orders on two ranks
// hang or mix their data: the hazards of comm.device = nccl, which host
// staging and MPI (whose requests start when issued) do not have. The
// emulated device takes this for comm.device = nccl (train/group_comm.h),
// so that the engine's NCCL paths run on the CPU in CI.
//
// The bytes move by MPI's nonblocking calls on a duplicate of the group's
// communicator (a send synchronous: done only once its receive has
// started), through host copies made for each operation: its input is
// read from the device when it starts (as an NCCL kernel reads it then, not
// when it was issued), its result written to the device when it completes.
// A buffer not on the device goes to the host Communicator as it is, after
// the operations issued before it have completed (as cuda/nccl_comm.h
// does). Counts are MPI's: at most INT_MAX elements (bytes, for what moves
// without arithmetic); bf16 has no MPI reduction (RankError).
//
// Operations advance in the waits and tests of every ordered and MPI
// Communicator of the thread that made them (comm/mpi_comm.cpp calls
// advance_ordered_communicators between its tests), which is where a rank
// waits for others; a rank computing does not advance them, as a GPU would,
// but it waits again before it needs anything from another rank.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/comm.h"
#include "comm/staged_comm.h"

namespace meshlm::comm {

// Collective over `group` (its duplicate). `host` moves host buffers;
// `device` says which buffers are on the device and copies them (it must
// outlive the result); `name` names the group in messages.
std::unique_ptr<Communicator> make_ordered_communicator(std::unique_ptr<Communicator> host,
                                                        MPI_Comm group, const DeviceAccess& device,
                                                        std::string name);

// Starts and completes what can be of the operations of this thread's ordered
// Communicators. Returns whether any operation is still pending.
bool advance_ordered_communicators();

}  // namespace meshlm::comm
