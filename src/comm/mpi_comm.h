// The MPI implementation of comm::Communicator, for host buffers. Each
// operation is one nonblocking MPI call (MPI_Iallreduce, MPI_Ireduce,
// MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Isend,
// MPI_Irecv) and its Handle wraps the MPI_Request. Waiting for a Handle also
// completes the older requests of the same Communicator first, so that
// operations complete in issue order as comm.h promises (and as a CUDA stream
// would order them): code that runs here does not race on the NCCL backend.
//
// Stream must be nullptr (RankError otherwise); bf16 has no MPI type
// (RankError); a count above INT_MAX is a RankError naming the operation,
// except for broadcast, which sends a large buffer in pieces of 1 GiB.
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/comm.h"

namespace meshlm::comm {

// Does not own `comm` (the process mesh does); `comm` must outlive every
// operation issued on the Communicator. Not collective.
// broadcast_piece_bytes: the largest piece of one MPI_Ibcast (MPI counts are
// int); tests make it small to exercise the split.
inline constexpr size_t kBroadcastPieceBytes = size_t{1} << 30;
std::unique_ptr<Communicator> make_mpi_communicator(
    MPI_Comm comm, size_t broadcast_piece_bytes = kBroadcastPieceBytes);

// f32 -> MPI_FLOAT, f64 -> MPI_DOUBLE, i32 -> MPI_INT32_T, u8 -> MPI_UINT8_T,
// u16 -> MPI_UINT16_T, u32 -> MPI_UINT32_T; bf16 -> RankError.
MPI_Datatype mpi_type(DType type);

}  // namespace meshlm::comm
