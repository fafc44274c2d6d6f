// The rank rule (MeshLayout) against brute-force enumeration, for every layout
// of up to 64 ranks. No communicators: pure arithmetic.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "mesh/mesh.h"

using namespace meshlm;

namespace {

constexpr int kMaxWorld = 64;

// Every (dp, tp, pp) with dp * tp * pp <= kMaxWorld.
std::vector<MeshLayout> all_layouts() {
  std::vector<MeshLayout> layouts;
  for (int dp = 1; dp <= kMaxWorld; ++dp)
    for (int tp = 1; dp * tp <= kMaxWorld; ++tp)
      for (int pp = 1; dp * tp * pp <= kMaxWorld; ++pp) layouts.emplace_back(dp, tp, pp);
  return layouts;
}

// The ranks s of the mesh, in increasing order, for which same(s) holds.
std::vector<int> ranks_where(const MeshLayout& m, const std::function<bool(MeshCoords)>& same) {
  std::vector<int> ranks;
  for (int s = 0; s < m.world(); ++s)
    if (same(m.coords(s))) ranks.push_back(s);
  return ranks;
}

std::string name(const MeshLayout& m) {
  return "dp " + std::to_string(m.dp()) + " tp " + std::to_string(m.tp()) + " pp " +
         std::to_string(m.pp());
}

}  // namespace

TEST(MeshLayout, CoordinatesFollowTheFormulaAndRoundTrip) {
  for (const MeshLayout& m : all_layouts()) {
    SCOPED_TRACE(name(m));
    ASSERT_EQ(m.world(), m.dp() * m.tp() * m.pp());
    for (int r = 0; r < m.world(); ++r) {
      const MeshCoords c = m.coords(r);
      EXPECT_EQ(c.tp, r % m.tp());
      EXPECT_EQ(c.dp, (r / m.tp()) % m.dp());
      EXPECT_EQ(c.pp, r / (m.tp() * m.dp()));
      EXPECT_EQ(m.rank(c), r);
    }
  }
}

TEST(MeshLayout, GroupsMatchBruteForceEnumeration) {
  for (const MeshLayout& m : all_layouts()) {
    SCOPED_TRACE(name(m));
    for (int r = 0; r < m.world(); ++r) {
      const MeshCoords c = m.coords(r);
      EXPECT_EQ(m.tp_group(r), ranks_where(m, [&](MeshCoords s) {
                  return s.dp == c.dp && s.pp == c.pp;
                }));
      EXPECT_EQ(m.dp_group(r), ranks_where(m, [&](MeshCoords s) {
                  return s.tp == c.tp && s.pp == c.pp;
                }));
      EXPECT_EQ(m.pp_group(r), ranks_where(m, [&](MeshCoords s) {
                  return s.dp == c.dp && s.tp == c.tp;
                }));
      const bool end_stage = c.pp == 0 || c.pp == m.pp() - 1;
      const std::vector<int> embedding =
          end_stage ? ranks_where(m, [&](MeshCoords s) {
            return s.dp == c.dp && s.tp == c.tp && (s.pp == 0 || s.pp == m.pp() - 1);
          })
                    : std::vector<int>{};
      EXPECT_EQ(m.embedding_group(r), embedding);
    }
  }
}

// The example worked in the comment of MeshLayout, spelled out.
TEST(MeshLayout, SixteenRankExample) {
  using G = std::vector<int>;
  const MeshLayout m(/*dp=*/2, /*tp=*/4, /*pp=*/2);
  ASSERT_EQ(m.world(), 16);
  EXPECT_EQ(m.coords(6), (MeshCoords{.dp = 1, .tp = 2, .pp = 0}));
  EXPECT_EQ(m.coords(13), (MeshCoords{.dp = 1, .tp = 1, .pp = 1}));

  const std::vector<G> tp = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}};
  const std::vector<G> dp = {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}};
  const std::vector<G> pp = {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}};
  for (const auto& [groups, of] :
       {std::pair{&tp, &MeshLayout::tp_group}, {&dp, &MeshLayout::dp_group},
        {&pp, &MeshLayout::pp_group}, {&pp, &MeshLayout::embedding_group}})
    for (const G& g : *groups)
      for (int r : g) EXPECT_EQ((m.*of)(r), g) << "rank " << r;
}

TEST(MeshLayout, EmbeddingGroupIsFirstAndLastStage) {
  const MeshLayout m(/*dp=*/2, /*tp=*/2, /*pp=*/4);  // stages of 4 ranks: 0-3, 4-7, 8-11, 12-15
  EXPECT_EQ(m.embedding_group(1), (std::vector<int>{1, 13}));
  EXPECT_EQ(m.embedding_group(14), (std::vector<int>{2, 14}));
  EXPECT_TRUE(m.embedding_group(5).empty());
  EXPECT_TRUE(m.embedding_group(10).empty());

  const MeshLayout one_stage(/*dp=*/2, /*tp=*/2, /*pp=*/1);
  for (int r = 0; r < one_stage.world(); ++r)
    EXPECT_EQ(one_stage.embedding_group(r), std::vector<int>{r});
}

TEST(MeshLayout, BadSizesNameTheKey) {
  for (auto [dp, tp, pp, key] : {std::tuple{0, 1, 1, "parallel.dp"}, {1, 0, 1, "parallel.tp"},
                                 {1, 1, -2, "parallel.pp"}}) {
    try {
      MeshLayout m(dp, tp, pp);
      ADD_FAILURE() << "no error for " << key;
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

// 6700417 * 641 * 2 = 2^33 + 2, which an int product wraps around to 2: a
// layout that size must be an error, not a mesh of 2 ranks.
TEST(MeshLayout, AProductBeyondIntIsAnError) {
  for (auto [dp, tp, pp] : {std::tuple{6700417, 641, 2}, {1 << 24, 4096, 1024}, {65536, 32768, 1}}) {
    try {
      MeshLayout m(dp, tp, pp);
      ADD_FAILURE() << "no error for dp " << dp << " tp " << tp << " pp " << pp << ", world "
                    << m.world();
    } catch (const CollectiveError& e) {
      const std::string what = e.what();
      for (const char* key : {"parallel.dp", "parallel.tp", "parallel.pp"})
        EXPECT_NE(what.find(key), std::string::npos) << what;
      EXPECT_NE(what.find(std::to_string(int64_t{dp} * tp * pp)), std::string::npos) << what;
    }
  }
  EXPECT_EQ(MeshLayout(32768, 65535, 1).world(), 2147450880);  // the largest products stay
}

TEST(MeshLayout, RanksOutsideTheMeshAreErrors) {
  const MeshLayout m(2, 2, 2);
  EXPECT_THROW(m.coords(-1), RankError);
  EXPECT_THROW(m.coords(8), RankError);
  EXPECT_THROW(m.tp_group(8), RankError);
  EXPECT_THROW(m.rank({.dp = 2, .tp = 0, .pp = 0}), RankError);
  EXPECT_THROW(m.rank({.dp = 0, .tp = 0, .pp = -1}), RankError);
}
