// The test programs' own main (gtest_main_mpi.cpp) on a failure of a rank
// other than 0: the rank prints it, naming itself, the test and the line,
// and the program fails (test_harness_rank_failure expects both).
#include <gtest/gtest.h>
#include <mpi.h>

TEST(HarnessSelfCheck, FailsOnRankOneOnly) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 1) ADD_FAILURE() << "the failure rank 1 is meant to report";
}
