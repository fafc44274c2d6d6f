// MPI for the life of the program: MPI_Init when constructed, MPI_Finalize
// when destroyed (unless an error path already finalized or aborted, see
// comm/errors.h). main() holds one; nothing else calls MPI_Init.
#pragma once

#include <mpi.h>

namespace meshlm::comm {

// Before MPI_Init: a process started without a launcher (a singleton: `meshlm
// ckpt ...`, `meshlm plan ...` from a shell) runs Open MPI without the helper
// daemon it would otherwise fork (ess_singleton_isolated; meshlm never spawns
// processes). That start takes 0.13 s instead of 0.3 s and a third of the
// CPU, and the singleton's MPI_Finalize has no daemon to part from. Only
// Open MPI's singleton reads the variable, and a value already in the
// environment wins.
void prefer_isolated_singleton();

class MpiSession {
public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  MPI_Comm world() const { return MPI_COMM_WORLD; }
  int world_rank() const { return rank_; }
  int world_size() const { return size_; }

private:
  int rank_ = 0, size_ = 1;
};

}  // namespace meshlm::comm
