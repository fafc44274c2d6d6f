// The process mesh: which global rank holds which (DP, TP, PP) coordinates, and
// the MPI communicators of its groups. The rank rule lives in MeshLayout and
// nowhere else; everything that needs a group asks this header for it.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace meshlm {

struct MeshCoords {
  int dp = 0, tp = 0, pp = 0;
  bool operator==(const MeshCoords&) const = default;
};

// The rank rule. Pure arithmetic, no MPI, so it is tested for every layout
// without starting a job. World size W = DP * TP * PP; global rank r has
//
//     tp = r % TP
//     dp = (r / TP) % DP
//     pp = r / (TP * DP)
//
// TP varies fastest because TP communicates inside every layer (several
// all-reduces per layer, forward and backward): with consecutive ranks on one
// node, a TP group sits on one node's NVLink. PP varies slowest because stages
// exchange only one activation per micro-batch, so stages are the ones allowed
// to cross the slower network between nodes. DP sits in between: one gradient
// reduction per step, overlappable with the backward pass.
//
// Worked example, 16 ranks, DP=2 TP=4 PP=2 (two nodes of 8 GPUs):
//
//     rank :  0  1  2  3  4  5  6  7 |  8  9 10 11 12 13 14 15
//     tp   :  0  1  2  3  0  1  2  3 |  0  1  2  3  0  1  2  3
//     dp   :  0  0  0  0  1  1  1  1 |  0  0  0  0  1  1  1  1
//     pp   :  0  0  0  0  0  0  0  0 |  1  1  1  1  1  1  1  1
//
//   TP groups (same dp, pp):  [0 1 2 3] [4 5 6 7] [8 9 10 11] [12 13 14 15]
//   DP groups (same tp, pp):  [0 4] [1 5] [2 6] [3 7] [8 12] [9 13] [10 14] [11 15]
//   PP groups (same dp, tp):  [0 8] [1 9] [2 10] [3 11] [4 12] [5 13] [6 14] [7 15]
//   Embedding groups (first and last stage of each PP group; with PP=2 every
//   rank is on one of them, so they equal the PP groups):
//                             [0 8] [1 9] [2 10] [3 11] [4 12] [5 13] [6 14] [7 15]
//
// On two nodes of 8 GPUs (ranks 0-7 and 8-15) each PP stage is one node, so
// the TP and DP groups stay on NVLink and only the PP sends cross the network.
class MeshLayout {
public:
  // CollectiveError naming parallel.dp / parallel.tp / parallel.pp when < 1.
  MeshLayout(int dp, int tp, int pp);

  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int world() const { return dp_ * tp_ * pp_; }

  MeshCoords coords(int rank) const;  // RankError when rank is outside [0, world)
  int rank(MeshCoords c) const;       // RankError when a coordinate is out of range

  // Members in increasing order of the varying coordinate, which is also
  // increasing global rank.
  std::vector<int> tp_group(int rank) const;  // same dp, pp
  std::vector<int> dp_group(int rank) const;  // same tp, pp
  std::vector<int> pp_group(int rank) const;  // same dp, tp

  // The ranks holding the tied token embedding (wte on the first stage, the
  // LM head on the last; their gradients are summed over this group): first
  // and last stage of rank's PP group, {first} only when PP == 1; empty when
  // rank is on neither the first nor the last stage.
  std::vector<int> embedding_group(int rank) const;

private:
  int dp_, tp_, pp_;
};

// The communicators of the mesh. Collective over `world`: every rank of it
// constructs (and destroys) a ProcessMesh together. Non-copyable; frees its
// communicators.
class ProcessMesh {
public:
  // CollectiveError (the same on every rank, no hang) when layout.world() is
  // not the size of `world`, naming parallel.dp, parallel.tp, parallel.pp,
  // their values, the product and the world size.
  // ranks_per_node > 0 subdivides the shared-memory node communicator into
  // consecutive groups of that many ranks (by node-local rank; the last group
  // may be smaller), so that one machine can act as several nodes in tests.
  // 0 = the real nodes. Negative: CollectiveError naming parallel.ranks_per_node.
  ProcessMesh(MPI_Comm world, const MeshLayout& layout, int ranks_per_node = 0);
  ~ProcessMesh();
  ProcessMesh(const ProcessMesh&) = delete;
  ProcessMesh& operator=(const ProcessMesh&) = delete;

  const MeshLayout& layout() const { return layout_; }
  int rank() const { return rank_; }  // in world()
  MeshCoords coords() const { return coords_; }

  // Each group communicator orders its ranks by the varying coordinate, so
  // MPI_Comm_rank(tp()) == coords().tp, and likewise for dp and pp.
  MPI_Comm world() const { return world_; }  // a duplicate of the `world` given
  MPI_Comm tp() const { return tp_; }
  MPI_Comm dp() const { return dp_; }
  MPI_Comm pp() const { return pp_; }
  MPI_Comm node() const { return node_; }  // ordered by world rank
  // Rank 0 of every node, ordered by world rank (so world rank 0 is its rank
  // 0); MPI_COMM_NULL on the other ranks. The base loader broadcasts over it.
  MPI_Comm node_leaders() const { return node_leaders_; }
  // The ranks that really share this machine's memory and cores
  // (MPI_COMM_TYPE_SHARED), whatever parallel.ranks_per_node says; ordered
  // by world rank.
  MPI_Comm host() const { return host_; }
  // Ordered by pp; MPI_COMM_NULL on ranks outside the embedding group.
  MPI_Comm embedding() const { return embedding_; }

  bool first_stage() const { return coords_.pp == 0; }
  bool last_stage() const { return coords_.pp == layout_.pp() - 1; }

  int node_index() const { return node_index_; }  // 0..node_count-1, by lowest world rank
  int node_count() const { return node_count_; }
  int node_rank() const { return node_rank_; }
  int node_size() const { return node_size_; }

  // Collective over world(): world rank 0 prints (log::info) one line per
  // rank, in rank order:
  //   "#  rank    3 | host <hostname> | node 1 | dp 1 tp 1 pp 0 | <extra>"
  // where <extra> is each rank's own `extra` (e.g. "device cpu | threads 1").
  // log::info prints on MPI_COMM_WORLD rank 0 only, which is world()'s rank 0
  // whenever world() is the whole job.
  void print_rank_lines(const std::string& extra) const;

private:
  MeshLayout layout_;
  MeshCoords coords_;
  int rank_ = 0;
  MPI_Comm world_ = MPI_COMM_NULL, tp_ = MPI_COMM_NULL, dp_ = MPI_COMM_NULL,
           pp_ = MPI_COMM_NULL, node_ = MPI_COMM_NULL, embedding_ = MPI_COMM_NULL,
           node_leaders_ = MPI_COMM_NULL, host_ = MPI_COMM_NULL;
  int node_index_ = 0, node_count_ = 1, node_rank_ = 0, node_size_ = 1;
};

// Collective over `world`: the ranks of this process's node as the run's
// mesh would count them (MPI_COMM_TYPE_SHARED; with ranks_per_node > 0 the
// node's piece of that many ranks, the last piece possibly smaller).
int node_rank_count(MPI_Comm world, int ranks_per_node);

}  // namespace meshlm
