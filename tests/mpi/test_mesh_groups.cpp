// ProcessMesh's communicators against MeshLayout's groups, for every layout of
// 8 ranks. All ranks run on one machine, so the real node is the whole job.
// meshlm-test-ranks: 8
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "mesh/mesh.h"

using namespace meshlm;

namespace {

constexpr int kRanks = 8;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int comm_rank(MPI_Comm c) {
  int r = -1;
  MPI_Comm_rank(c, &r);
  return r;
}

int comm_size(MPI_Comm c) {
  int n = -1;
  MPI_Comm_size(c, &n);
  return n;
}

// Collective over `c`: the MPI_COMM_WORLD ranks of its members, in the order of their rank in c.
std::vector<int> members(MPI_Comm c) {
  const int me = world_rank();
  std::vector<int> all(comm_size(c));
  MPI_Allgather(&me, 1, MPI_INT, all.data(), 1, MPI_INT, c);
  return all;
}

std::vector<MeshLayout> layouts_of_8() {
  std::vector<MeshLayout> layouts;
  for (int dp = 1; dp <= kRanks; dp *= 2)
    for (int tp = 1; dp * tp <= kRanks; tp *= 2) layouts.emplace_back(dp, tp, kRanks / (dp * tp));
  return layouts;
}

}  // namespace

TEST(ProcessMesh, RunsOnEightRanks) { ASSERT_EQ(comm_size(MPI_COMM_WORLD), kRanks); }

TEST(ProcessMesh, CommunicatorsMatchTheLayout) {
  const int me = world_rank();
  for (const MeshLayout& layout : layouts_of_8()) {
    SCOPED_TRACE("dp " + std::to_string(layout.dp()) + " tp " + std::to_string(layout.tp()) +
                 " pp " + std::to_string(layout.pp()));
    const ProcessMesh mesh(MPI_COMM_WORLD, layout);
    const MeshCoords c = layout.coords(me);
    EXPECT_EQ(mesh.rank(), me);
    EXPECT_EQ(mesh.coords(), c);
    EXPECT_EQ(comm_size(mesh.world()), kRanks);
    EXPECT_EQ(comm_rank(mesh.world()), me);

    // The rank inside each group is the group's coordinate.
    EXPECT_EQ(comm_rank(mesh.tp()), c.tp);
    EXPECT_EQ(comm_rank(mesh.dp()), c.dp);
    EXPECT_EQ(comm_rank(mesh.pp()), c.pp);
    EXPECT_EQ(comm_size(mesh.tp()), layout.tp());
    EXPECT_EQ(comm_size(mesh.dp()), layout.dp());
    EXPECT_EQ(comm_size(mesh.pp()), layout.pp());
    EXPECT_EQ(members(mesh.tp()), layout.tp_group(me));
    EXPECT_EQ(members(mesh.dp()), layout.dp_group(me));
    EXPECT_EQ(members(mesh.pp()), layout.pp_group(me));

    EXPECT_EQ(mesh.first_stage(), c.pp == 0);
    EXPECT_EQ(mesh.last_stage(), c.pp == layout.pp() - 1);
    const std::vector<int> embedding = layout.embedding_group(me);
    if (embedding.empty()) {
      EXPECT_EQ(mesh.embedding(), MPI_COMM_NULL);
    } else {
      EXPECT_NE(mesh.embedding(), MPI_COMM_NULL);
      if (mesh.embedding() != MPI_COMM_NULL) EXPECT_EQ(members(mesh.embedding()), embedding);
    }

    EXPECT_EQ(mesh.node_count(), 1);
    EXPECT_EQ(mesh.node_index(), 0);
    EXPECT_EQ(mesh.node_rank(), me);
    EXPECT_EQ(mesh.node_size(), kRanks);
  }
}

TEST(ProcessMesh, RanksPerNodeMakesSeveralNodesOfOneMachine) {
  const int me = world_rank();
  const MeshLayout layout(2, 2, 2);
  {
    const ProcessMesh mesh(MPI_COMM_WORLD, layout, /*ranks_per_node=*/2);
    EXPECT_EQ(mesh.node_count(), 4);
    EXPECT_EQ(mesh.node_index(), me / 2);
    EXPECT_EQ(mesh.node_rank(), me % 2);
    EXPECT_EQ(mesh.node_size(), 2);
    EXPECT_EQ(members(mesh.node()), (std::vector<int>{me / 2 * 2, me / 2 * 2 + 1}));
    // The leaders are the node rank 0s; the host is still the whole machine.
    if (me % 2 == 0)
      EXPECT_EQ(members(mesh.node_leaders()), (std::vector<int>{0, 2, 4, 6}));
    else
      EXPECT_EQ(mesh.node_leaders(), MPI_COMM_NULL);
    EXPECT_EQ(members(mesh.host()), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  }
  {
    // 8 ranks in nodes of 3: 0-2, 3-5, 6-7.
    const ProcessMesh mesh(MPI_COMM_WORLD, layout, /*ranks_per_node=*/3);
    EXPECT_EQ(mesh.node_count(), 3);
    EXPECT_EQ(mesh.node_index(), me / 3);
    EXPECT_EQ(mesh.node_rank(), me % 3);
    EXPECT_EQ(mesh.node_size(), me < 6 ? 3 : 2);
    if (me % 3 == 0)
      EXPECT_EQ(members(mesh.node_leaders()), (std::vector<int>{0, 3, 6}));
    else
      EXPECT_EQ(mesh.node_leaders(), MPI_COMM_NULL);
  }
}

TEST(ProcessMesh, WrongProductIsOneErrorOnEveryRank) {
  try {
    ProcessMesh mesh(MPI_COMM_WORLD, MeshLayout(2, 2, 1));
    ADD_FAILURE() << "no error";
  } catch (const CollectiveError& e) {
    const std::string msg = e.what();
    for (const char* part : {"parallel.dp", "parallel.tp", "parallel.pp", "= 4", "8 ranks"})
      EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

TEST(ProcessMesh, NegativeRanksPerNodeIsOneErrorOnEveryRank) {
  try {
    ProcessMesh mesh(MPI_COMM_WORLD, MeshLayout(2, 2, 2), -1);
    ADD_FAILURE() << "no error";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.ranks_per_node"), std::string::npos)
        << e.what();
  }
}

TEST(ProcessMesh, PrintRankLinesInRankOrder) {
  const int me = world_rank();
  const ProcessMesh mesh(MPI_COMM_WORLD, MeshLayout(2, 2, 2), /*ranks_per_node=*/4);
  if (me == 0) testing::internal::CaptureStdout();
  mesh.print_rank_lines("device cpu | threads " + std::to_string(me + 10));
  if (me != 0) return;

  std::istringstream out(testing::internal::GetCapturedStdout());
  std::string line;
  int r = 0;
  for (; std::getline(out, line); ++r) {
    const MeshCoords c = mesh.layout().coords(r);
    EXPECT_EQ(line.rfind(fmt::format("#  rank {:4} | host ", r), 0), 0u) << line;
    const std::string tail =
        fmt::format(" | node {} | dp {} tp {} pp {} | device cpu | threads {}", r / 4, c.dp, c.tp,
                    c.pp, r + 10);
    EXPECT_NE(line.find(tail), std::string::npos) << line;
  }
  EXPECT_EQ(r, kRanks);
}
