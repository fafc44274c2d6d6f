// A stand-in for MPI_Abort that neither returns nor ends the process, as
// MPI_Abort behaves when the launcher never answers it. Preloaded into the
// ranks of tests/cli/abort_backstop.sh (mpiexec -x LD_PRELOAD=...).
#include <mpi.h>
#include <unistd.h>

int MPI_Abort(MPI_Comm comm, int errorcode) {
  (void)comm;
  (void)errorcode;
  for (;;) pause();
}
