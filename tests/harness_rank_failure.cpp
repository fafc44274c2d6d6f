// The test programs' own main (gtest_main_mpi.cpp) on a failure of a rank
// other than 0: the rank prints it, naming itself, the test and the line,
// and the program fails (test_harness_rank_failure expects both); and its
// exit code where every test skipped (test_harness_all_skipped).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

TEST(HarnessSelfCheck, FailsOnRankOneOnly) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 1) ADD_FAILURE() << "the failure rank 1 is meant to report";
}

// For test_harness_all_skipped (one rank, filtered): MESHLM_ALL_SKIPPED_EXIT
// makes the program exit with its code only where every test that ran
// skipped and none failed.
TEST(HarnessSelfCheck, Skips) { GTEST_SKIP() << "meant to skip"; }
TEST(HarnessSelfCheck, Passes) {
  // The main brought MPI up before the tests.
  int up = 0;
  MPI_Initialized(&up);
  EXPECT_TRUE(up);
}
TEST(HarnessSelfCheck, FailsWhenAsked) {
  if (std::getenv("MESHLM_HARNESS_FAIL") != nullptr) ADD_FAILURE() << "asked to fail";
}
