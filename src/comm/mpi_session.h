// MPI for the life of the program: MPI_Init when constructed, MPI_Finalize
// when destroyed (unless an error path already finalized or aborted, see
// comm/errors.h). main() holds one; nothing else calls MPI_Init.
#pragma once

#include <mpi.h>

namespace meshlm::comm {

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
