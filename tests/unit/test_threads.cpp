// Threads per rank from CPU affinity masks (train/threads.h), worked by hand
// for the launches users make.
#include <gtest/gtest.h>

#include <vector>

#include "core/cpu_set.h"
#include "train/threads.h"

using namespace meshlm;

namespace {
CpuSet cores(std::initializer_list<int> ids) {
  CpuSet s;
  for (int c : ids) s.add(c);
  return s;
}
CpuSet range(int first, int last) {
  CpuSet s;
  for (int c = first; c <= last; ++c) s.add(c);
  return s;
}
}  // namespace

TEST(CpuSet, CountsOverlapsAndPrints) {
  const CpuSet a = cores({0, 1, 2, 3, 8, 10, 11});
  EXPECT_EQ(a.count(), 7);
  EXPECT_EQ(a.text(), "0-3,8,10-11");
  EXPECT_EQ(CpuSet{}.text(), "none");
  EXPECT_EQ(cores({1023}).text(), "1023");
  EXPECT_TRUE(a.overlaps(cores({11, 500})));
  EXPECT_FALSE(a.overlaps(cores({4, 9, 500})));
}

TEST(CpuSet, CurrentMaskIsNotEmpty) { EXPECT_GE(current_cpu_set().count(), 1); }

TEST(Threads, OneRankBoundToOneCoreRunsOneThread) {
  // mpiexec -n 1 on a 2-core machine: Open MPI binds the rank to core 0.
  const CpuSet mine = cores({0});
  EXPECT_EQ(threads_for(0, mine, {mine}).threads, 1);
}

TEST(Threads, OneUnboundRankTakesEveryCore) {
  const CpuSet mine = range(0, 1);  // --bind-to none on 2 cores
  EXPECT_EQ(threads_for(0, mine, {mine}).threads, 2);
}

TEST(Threads, RanksBoundToTheirOwnCoresRunOneEach) {
  const std::vector<CpuSet> host = {cores({0}), cores({1})};
  for (const CpuSet& m : host) {
    const RankThreads t = threads_for(0, m, host);
    EXPECT_EQ(t.threads, 1);
    EXPECT_EQ(t.sharers, 1);
  }
}

TEST(Threads, UnboundRanksSplitTheCores) {
  // 4 ranks, no binding, 16 cores: 4 threads each.
  const std::vector<CpuSet> host(4, range(0, 15));
  EXPECT_EQ(threads_for(0, host[0], host).threads, 4);
  // 8 ranks on 2 cores (oversubscribed tests): never fewer than 1.
  const std::vector<CpuSet> tight(8, range(0, 1));
  EXPECT_EQ(threads_for(0, tight[0], tight).threads, 1);
}

TEST(Threads, SocketsOfTwoRanksEach) {
  // Two sockets of 8 cores, two ranks bound to each socket (--map-by socket).
  const std::vector<CpuSet> host = {range(0, 7), range(0, 7), range(8, 15), range(8, 15)};
  for (const CpuSet& m : host) EXPECT_EQ(threads_for(0, m, host).threads, 4);
}

TEST(Threads, ExplicitCountWins) {
  const CpuSet mine = cores({0});
  const RankThreads t = threads_for(3, mine, {mine});
  EXPECT_EQ(t.threads, 3);
  EXPECT_EQ(t.cores.text(), "0");
}

// comm.wait = auto sleeps in its waits exactly where the cores are shared.
TEST(Threads, SharedCoresAreThoseWithMoreThreadsThanCores) {
  const std::vector<CpuSet> tight(4, range(0, 1));  // 4 unbound ranks on 2 cores
  EXPECT_TRUE(shares_cores(threads_for(0, tight[0], tight)));
  const std::vector<CpuSet> two(2, range(0, 1));  // 2 unbound ranks, one thread each
  EXPECT_FALSE(shares_cores(threads_for(0, two[0], two)));
  EXPECT_TRUE(shares_cores(threads_for(2, two[0], two))) << "2 ranks x 2 threads on 2 cores";
  const std::vector<CpuSet> own = {cores({0}), cores({1})};
  EXPECT_FALSE(shares_cores(threads_for(0, own[0], own)));
  EXPECT_TRUE(shares_cores(threads_for(3, own[0], own))) << "3 threads on one core";
  const std::vector<CpuSet> sixteen(4, range(0, 15));
  EXPECT_FALSE(shares_cores(threads_for(0, sixteen[0], sixteen)));
}
