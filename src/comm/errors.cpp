#include "comm/errors.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

namespace meshlm {

namespace {
int world_rank() {
  int init = 0, fin = 0, rank = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
}  // namespace

std::optional<RankMessage> first_failure(MPI_Comm comm, bool ok, const std::string& msg) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // Lowest failing rank, or `size` when all are fine.
  int mine = ok ? size : rank, first = size;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return std::nullopt;
  std::string text = (rank == first) ? msg : std::string();
  int len = static_cast<int>(text.size());
  MPI_Bcast(&len, 1, MPI_INT, first, comm);
  text.resize(len);
  MPI_Bcast(text.data(), len, MPI_CHAR, first, comm);
  return RankMessage{first, std::move(text)};
}

void check_all(MPI_Comm comm, bool ok, const std::string& msg, const char* file, int line) {
  std::optional<RankMessage> f = first_failure(comm, ok, msg);
  if (!f) return;
  if (f->rank != 0) f->text.insert(0, "rank " + std::to_string(f->rank) + ": ");
  throw CollectiveError(f->text, file, line);
}

void fatal_all(MPI_Comm comm, const std::string& msg, const char* file, int line) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    std::fprintf(stderr, "ERROR: %s (%s:%d)\n", msg.c_str(), file, line);
    std::fflush(stderr);
  }
  std::fflush(stdout);
  MPI_Barrier(comm);
  MPI_Finalize();
  std::exit(1);
}

void fatal_one(const std::string& msg, const char* file, int line) {
  std::fprintf(stderr, "ERROR on rank %d: %s (%s:%d)\n", world_rank(), msg.c_str(), file, line);
  std::fflush(stderr);
  std::fflush(stdout);
  int init = 0, fin = 0, size = 1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_size(MPI_COMM_WORLD, &size);
  // A job of one process (meshlm plan, the ckpt tools, a singleton run) has
  // no rank to take down: it exits 1 without MPI_Abort's banner. It does not
  // finalize either, which would let libraries flush what the error left
  // half-done.
  if (size > 1) abort_job(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void abort_job(MPI_Comm comm, int code) {
  // MPI_Abort hands the job's end to the launcher (Open MPI's daemon through
  // PMIx, or srun) and waits in it. Should that wait never end, this process
  // ends itself after kAbortGraceSeconds: a rank that exits without
  // MPI_Finalize makes every launcher end the job all the same. The grace
  // only ever cuts short a process that is already ending.
  const int rank = world_rank();
  try {
    std::thread([code, rank] {
      std::this_thread::sleep_for(std::chrono::seconds(kAbortGraceSeconds));
      std::fprintf(stderr, "rank %d: MPI_Abort has not ended this process in %d s; it exits (status %d)\n",
                   rank, kAbortGraceSeconds, code);
      std::fflush(stderr);
      std::_Exit(code);
    }).detach();
  } catch (const std::exception&) {
    // No thread to spare (an exhausted process): MPI_Abort alone.
  }
  MPI_Abort(comm, code);
  std::_Exit(code);
}

}  // namespace meshlm
