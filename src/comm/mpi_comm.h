// The MPI implementation of comm::Communicator, for host buffers. Each
// operation is one nonblocking MPI call (MPI_Iallreduce, MPI_Ireduce,
// MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Isend,
// MPI_Irecv) and its Handle wraps the MPI_Request, except the large
// reductions (below), which complete before the call returns. Waiting for a Handle also
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
#include <vector>

#include "comm/comm.h"

namespace meshlm::comm {

// Does not own `comm` (the process mesh does); `comm` must outlive every
// operation issued on the Communicator. Not collective.
// broadcast_piece_bytes: the largest piece of one MPI_Ibcast (MPI counts are
// int); tests make it small to exercise the split.
inline constexpr size_t kBroadcastPieceBytes = size_t{1} << 30;
std::unique_ptr<Communicator> make_mpi_communicator(
    MPI_Comm comm, size_t broadcast_piece_bytes = kBroadcastPieceBytes);

// The world ranks of `comm`'s ranks, in its order (what the stall watchdog
// names). Not collective.
std::vector<int> world_ranks_of(MPI_Comm comm);

// Large reductions. MPI's collectives allocate temporaries of their own,
// which no allocator of meshlm sees: with Open MPI, MPI_Iallreduce in place
// takes as much again as the message, MPI_Allreduce half of it, MPI_Reduce
// and MPI_Reduce_scatter_block up to (ranks - 1) times it on the root.
// Reductions (all_reduce, reduce, reduce_scatter) of more than kRingMinBytes
// over two or more ranks therefore run in meshlm's own ring of point-to-point
// messages (MPI_Isend / MPI_Irecv, which allocate nothing of the message's size), in
// pieces of at most half the bucket, through one scratch Buffer per process
// in the comm category (grown to the largest need, then kept):
//   ring_scratch_bytes = 2 * min(bucket / 2, block) rounded to elements,
// block = the elements one rank ends with (all_reduce: count / ranks,
// rounded up; reduce_scatter: count; reduce: count). Each block is reduced
// along one path of the ring, so every rank of an all_reduce holds the same
// bits; the order of the additions is the ring's, not MPI's.
// all_gather and broadcast allocate nothing of the message's size and stay
// MPI's. A bucket of 0 sends every reduction to MPI's collectives.
// What stays MPI's (kRingMinBytes and less: losses, norms, the ends of
// ZeRO's pieces) takes at most (ranks - 1) * kRingMinBytes of temporaries
// from the heap: 112 KiB over 8 ranks. At 1 MiB the threshold let
// MPI_Ireduce's temporaries (2 MiB over 8 ranks) come and go inside a step.
inline constexpr size_t kRingMinBytes = size_t{16} << 10;
inline constexpr size_t kDefaultBucketBytes = size_t{32} << 20;
// The bucket of every MPI Communicator of the process (comm.bucket_mb), and
// the size above which a reduction takes the ring (tests make it 0); set
// before the first large reduction.
void set_bucket_bytes(size_t bytes, size_t ring_min_bytes = kRingMinBytes);
size_t bucket_bytes();
size_t ring_scratch_bytes(size_t block_elements, size_t element_bytes, size_t bucket_bytes);
// The scratch one reduction needs under the process's settings: 0 when it
// goes to MPI's collective (one rank, bucket 0, or kRingMinBytes and less).
// `count` as the Communicator call takes it. A reduce's chain starts at the
// rank after `root`, which only sends: given the group rank `rank` of the
// caller (not -1), that rank needs none.
enum class Reduction { all_reduce, reduce, reduce_scatter };
size_t ring_scratch_bytes_of(Reduction kind, size_t count, DType type, int ranks, int rank = -1,
                             int root = 0);
// Frees the scratch (the next large reduction makes it again).
void release_ring_scratch();

// comm.wait (WaitPolicy, comm/comm.h) for every wait of an MPI
// Communicator: Handles, the ring reductions' messages and barrier. `sleep`
// tests the requests (MPI_Testall, which also progresses them) and sleeps
// between tests, from kWaitSleepFirstUs doubling to kWaitSleepMostUs: a
// waiting rank gives its core away, at the cost of up to kWaitSleepMostUs
// of latency per wait.
inline constexpr int kWaitSleepFirstUs = 20;
inline constexpr int kWaitSleepMostUs = 500;
// automatic is a RankError: the caller resolves it.
void set_wait_policy(WaitPolicy policy);
WaitPolicy wait_policy();

// f32 -> MPI_FLOAT, f64 -> MPI_DOUBLE, i32 -> MPI_INT32_T, u8 -> MPI_UINT8_T,
// u16 -> MPI_UINT16_T, u32 -> MPI_UINT32_T; bf16 -> RankError.
MPI_Datatype mpi_type(DType type);
// sum -> MPI_SUM, min -> MPI_MIN, max -> MPI_MAX.
MPI_Op mpi_op(ReduceOp op);

// True when MPI was initialised with MPI_THREAD_MULTIPLE (comm/mpi_session.h
// asks for it): a second thread may then make MPI calls of its own, on a
// communicator of its own (checkpoint.async's writer).
bool threads_may_call_mpi();

// A duplicate of a communicator, freed with its owner: the same group with a
// separate context, so that collectives on it never meet those on the
// original (or a part of its group: first_ranks). Making one is collective
// over `comm`.
class OwnedComm {
public:
  OwnedComm() = default;
  explicit OwnedComm(MPI_Comm comm);
  // The ranks [0, n) of `comm` as a communicator of their own (ranks in
  // order), MPI_COMM_NULL (get()) on the others. Collective over `comm`.
  static std::unique_ptr<OwnedComm> first_ranks(MPI_Comm comm, int n);
  ~OwnedComm();
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;
  MPI_Comm get() const { return comm_; }

private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace meshlm::comm
