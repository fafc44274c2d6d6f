// The two error contracts under MPI (run on 4 ranks by ctest).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "app/parameter_file.h"
#include "comm/errors.h"
#include "core/error.h"

using namespace meshlm;

namespace {
int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
}  // namespace

TEST(CheckAll, PassesWhenEveryRankIsFine) {
  EXPECT_NO_THROW(check_all(MPI_COMM_WORLD, true, "unused", MESHLM_HERE));
}

TEST(CheckAll, OneFailingRankMakesEveryRankThrowItsMessage) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_GE(size, 2) << "run this test on several ranks";
  const int bad = size - 1;
  try {
    check_all(MPI_COMM_WORLD, rank() != bad, "cannot open shard.h5 on rank " + std::to_string(rank()),
              MESHLM_HERE);
    FAIL() << "rank " << rank() << " did not throw";
  } catch (const CollectiveError& e) {
    const std::string expect = "rank " + std::to_string(bad) + ": cannot open shard.h5 on rank " +
                               std::to_string(bad);
    EXPECT_EQ(std::string(e.what()), expect);
  }
}

TEST(CheckAll, LowestFailingRankWins) {
  try {
    check_all(MPI_COMM_WORLD, rank() == 0, "failure on " + std::to_string(rank()), MESHLM_HERE);
    FAIL();
  } catch (const CollectiveError& e) {
    EXPECT_EQ(std::string(e.what()), "rank 1: failure on 1");
  }
}

TEST(LoadRunConfig, MissingFileIsOneErrorOnEveryRank) {
  try {
    load_run_config(MPI_COMM_WORLD, "/nonexistent/dir/run.cfg", {});
    FAIL();
  } catch (const CollectiveError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot read parameter file '/nonexistent/dir/run.cfg'");
  }
}
