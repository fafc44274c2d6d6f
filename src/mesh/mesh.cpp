#include "mesh/mesh.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>

#include "comm/errors.h"
#include "core/error.h"
#include "core/log.h"

namespace meshlm {

namespace {

// Every member of the group of `c` in which only the coordinate `field` varies
// (0..n-1); the rest of `c` is held fixed. Increasing `field` is increasing rank.
std::vector<int> group_varying(const MeshLayout& layout, MeshCoords c, int MeshCoords::*field,
                               int n) {
  std::vector<int> ranks;
  for (c.*field = 0; c.*field < n; ++(c.*field)) ranks.push_back(layout.rank(c));
  return ranks;
}

}  // namespace

MeshLayout::MeshLayout(int dp, int tp, int pp) : dp_(dp), tp_(tp), pp_(pp) {
  for (auto [key, value] : {std::pair{"parallel.dp", dp}, {"parallel.tp", tp}, {"parallel.pp", pp}})
    if (value < 1)
      throw CollectiveError(fmt::format("{} must be >= 1, got {}", key, value), MESHLM_HERE);
  // Every rank number is an int (MPI's); the product is formed in 64 bits so
  // that a layout too large for any job cannot wrap around to a small world.
  const int64_t world = int64_t{dp} * tp * pp;
  if (world > std::numeric_limits<int>::max())
    throw CollectiveError(
        fmt::format("parallel.dp ({}) * parallel.tp ({}) * parallel.pp ({}) = {} ranks, more than "
                    "an MPI job can have ({})",
                    dp, tp, pp, world, std::numeric_limits<int>::max()),
        MESHLM_HERE);
}

MeshCoords MeshLayout::coords(int rank) const {
  if (rank < 0 || rank >= world())
    throw RankError(fmt::format("rank {} is outside the mesh of {} ranks (dp {} tp {} pp {})",
                                rank, world(), dp_, tp_, pp_),
                    MESHLM_HERE);
  return {.dp = (rank / tp_) % dp_, .tp = rank % tp_, .pp = rank / (tp_ * dp_)};
}

int MeshLayout::rank(MeshCoords c) const {
  if (c.dp < 0 || c.dp >= dp_ || c.tp < 0 || c.tp >= tp_ || c.pp < 0 || c.pp >= pp_)
    throw RankError(fmt::format("coordinates dp {} tp {} pp {} are outside the mesh "
                                "(dp {} tp {} pp {})",
                                c.dp, c.tp, c.pp, dp_, tp_, pp_),
                    MESHLM_HERE);
  return (c.pp * dp_ + c.dp) * tp_ + c.tp;
}

std::vector<int> MeshLayout::tp_group(int rank) const {
  return group_varying(*this, coords(rank), &MeshCoords::tp, tp_);
}

std::vector<int> MeshLayout::dp_group(int rank) const {
  return group_varying(*this, coords(rank), &MeshCoords::dp, dp_);
}

std::vector<int> MeshLayout::pp_group(int rank) const {
  return group_varying(*this, coords(rank), &MeshCoords::pp, pp_);
}

std::vector<int> MeshLayout::embedding_group(int rank) const {
  MeshCoords first = coords(rank), last = first;
  if (first.pp != 0 && first.pp != pp_ - 1) return {};
  first.pp = 0;
  last.pp = pp_ - 1;
  if (pp_ == 1) return {this->rank(first)};
  return {this->rank(first), this->rank(last)};
}

ProcessMesh::ProcessMesh(MPI_Comm world, const MeshLayout& layout, int ranks_per_node)
    : layout_(layout) {
  // Both checks go through check_all before any communicator exists, so a bad
  // setting is one error on every rank and nothing is left to free.
  int size = 0;
  MPI_Comm_size(world, &size);
  check_all(world, ranks_per_node >= 0,
            fmt::format("parallel.ranks_per_node must be >= 0 (0 = the real nodes), got {}",
                        ranks_per_node),
            MESHLM_HERE);
  check_all(world, layout.world() == size,
            fmt::format("parallel.dp * parallel.tp * parallel.pp = {} * {} * {} = {}, but the "
                        "job has {} ranks; the product must equal the number of ranks",
                        layout.dp(), layout.tp(), layout.pp(), layout.world(), size),
            MESHLM_HERE);

  // Our own copy of world, so the mesh's traffic cannot match a message of the caller's.
  MPI_Comm_dup(world, &world_);
  MPI_Comm_rank(world_, &rank_);
  coords_ = layout_.coords(rank_);

  // colour = the fixed coordinates as one number, key = the varying one, so
  // the rank inside each group communicator is the group's coordinate.
  const MeshCoords& c = coords_;
  const int DP = layout_.dp(), TP = layout_.tp();
  MPI_Comm_split(world_, c.pp * DP + c.dp, c.tp, &tp_);
  MPI_Comm_split(world_, c.pp * TP + c.tp, c.dp, &dp_);
  MPI_Comm_split(world_, c.dp * TP + c.tp, c.pp, &pp_);
  const bool holds_embedding = first_stage() || last_stage();
  MPI_Comm_split(world_, holds_embedding ? c.dp * TP + c.tp : MPI_UNDEFINED, c.pp, &embedding_);

  // Node: the ranks that share memory, optionally cut into consecutive
  // pieces so that one test machine plays several nodes.
  MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host_);
  if (ranks_per_node > 0) {
    int host_rank = 0;
    MPI_Comm_rank(host_, &host_rank);
    MPI_Comm_split(host_, host_rank / ranks_per_node, host_rank, &node_);
  } else {
    MPI_Comm_dup(host_, &node_);
  }
  MPI_Comm_rank(node_, &node_rank_);
  MPI_Comm_size(node_, &node_size_);
  MPI_Comm_split(world_, node_rank_ == 0 ? 0 : MPI_UNDEFINED, rank_, &node_leaders_);

  // Nodes are numbered by their lowest world rank: a node's leader is the
  // rank that is its own leader, and a node's index counts the leaders below it.
  int leader = rank_;
  MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, node_);
  std::vector<int> leaders(size);
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, world_);
  node_count_ = node_index_ = 0;
  for (int r = 0; r < size; ++r) {
    if (leaders[r] != r) continue;
    ++node_count_;
    if (r < leader) ++node_index_;
  }
}

ProcessMesh::~ProcessMesh() {
  // A mesh that outlives MPI_Finalize has nothing left to free.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* comm : {&node_leaders_, &host_, &embedding_, &node_, &pp_, &dp_, &tp_, &world_})
    if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
}

void ProcessMesh::print_rank_lines(const std::string& extra) const {
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_len = 0;
  MPI_Get_processor_name(host, &host_len);
  std::string line = fmt::format("#  rank {:4} | host {} | node {} | dp {} tp {} pp {}", rank_,
                                 std::string(host, host_len), node_index_, coords_.dp, coords_.tp,
                                 coords_.pp);
  if (!extra.empty()) line += " | " + extra;

  // Gathered to rank 0 and printed there in rank order, never raced to stdout.
  int size = layout_.world();
  int len = static_cast<int>(line.size());
  std::vector<int> lens(rank_ == 0 ? size : 0), offsets(lens.size());
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, world_);
  if (rank_ == 0) std::exclusive_scan(lens.begin(), lens.end(), offsets.begin(), 0);
  std::string all(rank_ == 0 ? offsets.back() + lens.back() : 0, '\0');
  MPI_Gatherv(line.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0,
              world_);
  for (size_t r = 0; r < lens.size(); ++r) log::info("{}", all.substr(offsets[r], lens[r]));
}

int node_rank_count(MPI_Comm world, int ranks_per_node) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm host = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  int host_rank = 0, host_size = 1;
  MPI_Comm_rank(host, &host_rank);
  MPI_Comm_size(host, &host_size);
  MPI_Comm_free(&host);
  if (ranks_per_node <= 0) return host_size;
  const int first = host_rank / ranks_per_node * ranks_per_node;
  return std::min(ranks_per_node, host_size - first);
}

}  // namespace meshlm
