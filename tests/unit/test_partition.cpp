// Pipeline stage partition (plan/partition.h): balance_stages against brute
// force over every composition of L layers into p stages, the GPT-2 cost
// model worked by hand, and the parallel.stage_layers parser.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/partition.h"

using namespace meshlm;

namespace {

// The same sum in the same order as the library, so that ties compare equal.
double stage_cost(int k, int n, int p, const StageCosts& c) {
  double cost = n * c.layer;
  if (k == 0) cost += c.embedding;
  if (k == p - 1) cost += c.head;
  return cost;
}

double largest_cost(const std::vector<int>& layers, const StageCosts& c) {
  const int p = static_cast<int>(layers.size());
  double worst = 0;
  for (int k = 0; k < p; ++k) worst = std::max(worst, stage_cost(k, layers[k], p, c));
  return worst;
}

// Summed from the last stage, as the library's suffix tables do, so that
// equal sums are the same double.
double sum_of_squares(const std::vector<int>& layers, const StageCosts& c) {
  const int p = static_cast<int>(layers.size());
  double sum = 0;
  for (int k = p - 1; k >= 0; --k) {
    const double cost = stage_cost(k, layers[k], p, c);
    sum = cost * cost + sum;
  }
  return sum;
}

// Every composition of L into p parts >= 1; the one with the least largest
// cost, then the least sum of squared costs, then the lexicographically
// largest.
std::vector<int> brute_force(int L, int p, const StageCosts& c, const StageFits& fits = {}) {
  std::vector<int> cur, best;
  double best_cost = 0, best_squares = 0;
  std::function<void(int)> rec = [&](int left) {
    const int k = static_cast<int>(cur.size());
    if (k == p - 1) {
      cur.push_back(left);
      bool ok = true;
      for (int j = 0; j < p && fits; ++j) ok = ok && fits(j, cur[j]);
      if (!ok) {
        cur.pop_back();
        return;
      }
      const double cost = largest_cost(cur, c), squares = sum_of_squares(cur, c);
      const bool tie = cost == best_cost && squares == best_squares;
      const bool better = best.empty() || cost < best_cost ||
                          (cost == best_cost && squares < best_squares) || (tie && cur > best);
      if (better) {
        best = cur;
        best_cost = cost;
        best_squares = squares;
      }
      cur.pop_back();
      return;
    }
    for (int n = 1; n <= left - (p - k - 1); ++n) {
      cur.push_back(n);
      rec(left - n);
      cur.pop_back();
    }
  };
  rec(L);
  return best;
}

std::string balance_error(int L, int p) {
  try {
    balance_stages(L, p, StageCosts{});
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "";
}

std::string parse_error(const std::string& text, int L, int p) {
  try {
    parse_stage_layers(text, L, p);
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "";
}

GPTConfig small_config() {
  GPTConfig cfg;
  cfg.n_layer = 3;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.vocab_size = 100;  // Vp = 128
  cfg.max_seq_len = 8;
  return cfg;
}

}  // namespace

TEST(Partition, GPTStageCostsByHand) {
  // C = 16, T = 8, Vp = 128:
  //   layer = 3 (24*256 + 4*8*16)        = 3 (6144 + 512)   = 19968
  //   embedding = 3*16                                      = 48
  //   head  = 3 (2*16*128) + 3*5*128     = 12288 + 1920     = 14208
  const StageCosts c = gpt_stage_costs(small_config(), 8);
  EXPECT_DOUBLE_EQ(c.layer, 19968);
  EXPECT_DOUBLE_EQ(c.embedding, 48);
  EXPECT_DOUBLE_EQ(c.head, 14208);

  // GPT-2 124M at T = 1024 (Vp = 50304): the head weighs about 4.5 layers.
  //   layer = 3 (24*768^2 + 4*1024*768) = 3 (14155776 + 3145728) = 51904512
  //   head  = 6*768*50304 + 15*50304    = 231800832 + 754560     = 232555392
  GPTConfig gpt2;
  gpt2.n_layer = 12;
  gpt2.n_head = 12;
  gpt2.n_embd = 768;
  gpt2.vocab_size = 50257;
  gpt2.max_seq_len = 1024;
  const StageCosts g = gpt_stage_costs(gpt2, 1024);
  EXPECT_DOUBLE_EQ(g.layer, 51904512);
  EXPECT_DOUBLE_EQ(g.embedding, 2304);
  EXPECT_DOUBLE_EQ(g.head, 232555392);
  // Over 4 stages: head + 1 layer (5.48 layers) is already the slowest
  // stage, so the last stage gets one layer and the other 11 spread evenly;
  // the embedding tips the smaller share to stage 0. 5,5,1,1 would reach the
  // same largest cost.
  EXPECT_EQ(balance_stages(12, 4, g), (std::vector<int>{3, 4, 4, 1}));
  EXPECT_EQ(balance_stages(12, 4, g), brute_force(12, 4, g));
}

TEST(Partition, MatchesBruteForce) {
  const std::vector<StageCosts> settings = {
      {1, 0, 0},    {1, 0, 3},     {1, 0.5, 2.5}, {2, 1, 7},
      {1, 0, 0.4},  {1, 3, 0},     {1, 0.1, 0.2}, gpt_stage_costs(small_config(), 8),
  };
  for (const StageCosts& c : settings)
    for (int L = 1; L <= 12; ++L)
      for (int p = 1; p <= std::min(L, 6); ++p) {
        SCOPED_TRACE("L=" + std::to_string(L) + " p=" + std::to_string(p) + " costs " +
                     std::to_string(c.layer) + "/" + std::to_string(c.embedding) + "/" +
                     std::to_string(c.head));
        const std::vector<int> got = balance_stages(L, p, c);
        ASSERT_EQ(got.size(), size_t(p));
        int sum = 0;
        for (int n : got) {
          EXPECT_GE(n, 1);
          sum += n;
        }
        EXPECT_EQ(sum, L);
        EXPECT_EQ(got, brute_force(L, p, c));
      }
}

TEST(Partition, EqualCostsBalance) {
  EXPECT_EQ(balance_stages(8, 4, {}), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(balance_stages(7, 2, {}), (std::vector<int>{4, 3}));  // tie: earlier stage larger
  // 3,3,3,1 has the same largest cost; the even split wins, then the
  // earlier stages take the extra layers.
  EXPECT_EQ(balance_stages(10, 4, {}), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(balance_stages(11, 4, {}), (std::vector<int>{3, 3, 3, 2}));
  EXPECT_EQ(balance_stages(5, 5, {}), (std::vector<int>{1, 1, 1, 1, 1}));
  EXPECT_EQ(balance_stages(5, 1, {1, 2, 3}), (std::vector<int>{5}));
}

// The sizes the planner promises to handle, quickly and exactly.
TEST(Partition, LargestSizes) {
  std::vector<int> want(64, 15);
  std::fill(want.begin(), want.begin() + 40, 16);  // 1000 = 40*16 + 24*15
  EXPECT_EQ(balance_stages(1000, 64, {}), want);
  const std::vector<int> got = balance_stages(1000, 64, {1, 0.01, 4.5});
  EXPECT_EQ(stage_bounds(got).back(), 1000);
  // Below 16 the stages hold at most 15*63 + 11 layers; at 16 the last
  // stage takes 11 (11 + 4.5 <= 16 < 12 + 4.5).
  EXPECT_EQ(largest_cost(got, {1, 0.01, 4.5}), 16);
  EXPECT_EQ(got.back(), 11);
  // The largest values validation lets through (model.n_layer and
  // parallel.pp up to 1024) balance at once: every stage gets its layers.
  for (int pp : {1, 2, 7, 512, 1023, 1024}) {
    const std::vector<int> all = balance_stages(1024, pp, {1, 0.01, 4.5});
    ASSERT_EQ(static_cast<int>(all.size()), pp);
    EXPECT_EQ(stage_bounds(all).back(), 1024);
    EXPECT_GE(*std::min_element(all.begin(), all.end()), 1) << pp;
  }
}

TEST(Partition, HeavyHeadMovesLayersOffLastStage) {
  // head = 2.5 layers: 5,3 costs max(5, 5.5) = 5.5, the only optimum.
  EXPECT_EQ(balance_stages(8, 2, {1, 0, 2.5}), (std::vector<int>{5, 3}));
  // head = 3 layers: 5,3 -> costs 5,6 and 6,2 -> costs 6,5 tie on both the
  // largest cost and the squares; the earlier stage takes more.
  EXPECT_EQ(balance_stages(8, 2, {1, 0, 3}), (std::vector<int>{6, 2}));
  EXPECT_EQ(brute_force(8, 2, {1, 0, 3}), (std::vector<int>{6, 2}));
  // A heavy embedding does the same at the other end.
  EXPECT_EQ(balance_stages(8, 2, {1, 2.5, 0}), (std::vector<int>{3, 5}));
}

TEST(Partition, StageCountErrors) {
  for (auto [L, p] : {std::pair{4, 5}, std::pair{4, 0}, std::pair{4, -1}, std::pair{0, 1}}) {
    const std::string msg = balance_error(L, p);
    EXPECT_NE(msg.find("parallel.pp = " + std::to_string(p)), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.n_layer = " + std::to_string(L)), std::string::npos) << msg;
  }
  EXPECT_EQ(balance_error(4, 4), "");
}

TEST(Partition, ParsesStageLayers) {
  EXPECT_EQ(parse_stage_layers("3,3,2,2", 10, 4), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(parse_stage_layers(" 3 , 3,2 ,\t2 ", 10, 4), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(parse_stage_layers("7", 7, 1), (std::vector<int>{7}));
}

TEST(Partition, StageLayersErrorsNameTheKey) {
  struct Case {
    const char* text;
    int L, p;
    const char* also;  // a second key or detail the message must name
  };
  const Case cases[] = {
      {"", 10, 4, "empty"},
      {"  ", 10, 4, "empty"},
      {"3,x,2,2", 10, 4, "'x'"},
      {"3,,3,4", 10, 4, "''"},
      {"3,3,2,2,", 10, 4, "''"},
      {"3,3.5,2,2", 10, 4, "'3.5'"},
      {"3 3,2,2", 10, 4, "'3 3'"},
      {"+3,3,2,2", 10, 4, "'+3'"},
      {"99999999999,1", 10, 2, "'99999999999'"},
      {"0,4,3,3", 10, 4, "at least one"},
      {"-1,5,3,3", 10, 4, "at least one"},
      {"3,3,4", 10, 4, "parallel.pp = 4"},
      {"3,3,2,2,0", 10, 4, "at least one"},
      {"3,3,3,2", 10, 4, "model.n_layer = 10"},
  };
  for (const Case& c : cases) {
    const std::string msg = parse_error(c.text, c.L, c.p);
    EXPECT_NE(msg.find("parallel.stage_layers = '" + std::string(c.text) + "'"),
              std::string::npos)
        << "'" << c.text << "': " << msg;
    EXPECT_NE(msg.find(c.also), std::string::npos) << "'" << c.text << "': " << msg;
  }
}

TEST(Partition, StageBounds) {
  EXPECT_EQ(stage_bounds({3, 3, 2, 2}), (std::vector<int>{0, 3, 6, 8, 10}));
  EXPECT_EQ(stage_bounds({5}), (std::vector<int>{0, 5}));
  EXPECT_EQ(stage_bounds({}), (std::vector<int>{0}));
}

// Under memory: only the splits whose every stage fits, the best of those;
// none when no split fits.
TEST(Partition, UnderMemoryTakesTheBestSplitWhoseStagesAllFit) {
  const StageCosts g = gpt_stage_costs(small_config(), 8);
  for (int L = 2; L <= 10; ++L)
    for (int p = 2; p <= std::min(L, 5); ++p)
      for (unsigned mask_seed = 1; mask_seed < 40; ++mask_seed) {
        // A deterministic pseudo-random set of (stage, layers) that fit,
        // more of them the fewer layers.
        const StageFits fits = [&](int k, int n) {
          const unsigned h = (mask_seed * 2654435761u) ^ (unsigned(k) * 40503u) ^ (unsigned(n) * 2246822519u);
          return n <= 2 || (h >> 7) % 5 != 0;
        };
        SCOPED_TRACE("L=" + std::to_string(L) + " p=" + std::to_string(p) + " seed " +
                     std::to_string(mask_seed));
        const std::vector<int> got = balance_stages(L, p, g, fits);
        EXPECT_EQ(got, brute_force(L, p, g, fits));
        for (int k = 0; k < int(got.size()); ++k) EXPECT_TRUE(fits(k, got[k]));
      }
  // The stage of the classifier may hold only one layer: the rest move forward.
  const StageCosts heavy{1, 0, 4.5};
  const std::vector<int> capped =
      balance_stages(12, 4, heavy, [](int k, int n) { return k != 0 || n <= 2; });
  EXPECT_EQ(capped, (std::vector<int>{2, 5, 4, 1}));
  EXPECT_TRUE(balance_stages(12, 4, heavy, [](int, int n) { return n <= 2; }).empty());
}
