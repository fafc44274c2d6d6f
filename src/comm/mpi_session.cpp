#include "comm/mpi_session.h"

#include <cstdlib>

namespace meshlm::comm {

void prefer_isolated_singleton() { ::setenv("OMPI_MCA_ess_singleton_isolated", "1", /*overwrite=*/0); }

MpiSession::MpiSession(int* argc, char*** argv) {
  prefer_isolated_singleton();
  // A second thread may write checkpoints (checkpoint.async) while the main
  // one trains: MPI calls from both, each on its own communicator.
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace meshlm::comm
