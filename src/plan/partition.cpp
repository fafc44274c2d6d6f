#include "plan/partition.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "core/error.h"

namespace meshlm {

StageCosts gpt_stage_costs(const GPTConfig& cfg, int seq_len) {
  const double C = cfg.n_embd, T = seq_len, Vp = cfg.padded_vocab_size();
  StageCosts c;
  c.layer = 3 * (2 * cfg.block_matmul_elements() + 4 * T * C);
  c.embedding = 3 * C;
  c.head = 3 * (2 * C * Vp) + 3 * 5 * Vp;
  return c;
}

namespace {

// One formula for every caller, so that equal splits compare exactly equal.
double stage_cost(int stage, int layers, int num_stages, const StageCosts& c) {
  double cost = layers * c.layer;
  if (stage == 0) cost += c.embedding;
  if (stage == num_stages - 1) cost += c.head;
  return cost;
}

}  // namespace

std::vector<int> balance_stages(int n_layer, int num_stages, const StageCosts& costs,
                                const StageFits& fits) {
  const int L = n_layer, p = num_stages;
  if (p < 1 || p > L)
    throw CollectiveError("parallel.pp = " + std::to_string(p) + " with model.n_layer = " +
                              std::to_string(L) +
                              ": every pipeline stage needs at least one layer",
                          MESHLM_HERE);

  // Stages k..p-1 hold layers i..L-1; infinite where that leaves a stage
  // empty. Stage k takes n layers, 1 <= n <= L - i - (stages after k).
  const double inf = std::numeric_limits<double>::infinity();
  auto table = [&] {
    return std::vector<std::vector<double>>(p + 1, std::vector<double>(L + 1, inf));
  };
  // allowed[k][n]: stage k may hold n layers.
  std::vector<std::vector<char>> allowed(p, std::vector<char>(L + 1, 1));
  if (fits)
    for (int k = 0; k < p; ++k)
      for (int n = 1; n <= L - (p - 1); ++n) allowed[k][n] = fits(k, n) ? 1 : 0;

  // Pass 1, worst[k][i]: the least possible largest stage cost. The whole
  // pipeline runs at the pace of worst[0][0].
  auto worst = table();
  worst[p][L] = 0;
  // Stage 0 starts at layer 0: only worst[0][0] (and squares[0][0]) is needed.
  auto last_start = [&](int k) { return k == 0 ? 0 : L - (p - k); };
  for (int k = p - 1; k >= 0; --k)
    for (int i = k; i <= last_start(k); ++i)
      for (int n = 1; i + n + (p - k - 1) <= L; ++n)
        if (allowed[k][n])
          worst[k][i] = std::min(worst[k][i],
                                 std::max(stage_cost(k, n, p, costs), worst[k + 1][i + n]));
  const double limit = worst[0][0];
  if (limit == inf) return {};  // no split where every stage fits

  // Pass 2, squares[k][i]: among splits whose stages all cost <= limit, the
  // least sum of squared stage costs. Many splits share the largest cost
  // (10 equal layers over 4 stages: 3,3,2,2 and 3,3,3,1, the same step
  // time); the most even one keeps less activation memory on its fullest
  // stages and loses less when the cost model is off.
  auto squares = table();
  squares[p][L] = 0;
  for (int k = p - 1; k >= 0; --k)
    for (int i = k; i <= last_start(k); ++i)
      for (int n = 1; i + n + (p - k - 1) <= L; ++n) {
        const double c = stage_cost(k, n, p, costs);
        if (allowed[k][n] && c <= limit)
          squares[k][i] = std::min(squares[k][i], c * c + squares[k + 1][i + n]);
      }

  // Walk forward giving each stage the most layers that keep the optimum:
  // the lexicographically largest of the remaining ties, so every rank
  // computes the same split. The == is exact: squares[k][i] is the min of
  // these very sums.
  std::vector<int> layers(p);
  int i = 0;
  for (int k = 0; k < p; ++k) {
    int n = L - i - (p - k - 1);
    for (; n >= 1; --n) {
      const double c = stage_cost(k, n, p, costs);
      if (allowed[k][n] && c <= limit && c * c + squares[k + 1][i + n] == squares[k][i]) break;
    }
    MESHLM_CHECK(n >= 1, "balance_stages found no layers for stage " + std::to_string(k));
    layers[k] = n;
    i += n;
  }
  return layers;
}

std::string layers_text(const std::vector<int>& layers) {
  std::string s;
  for (int v : layers) {
    if (!s.empty()) s += ',';
    s += std::to_string(v);
  }
  return s;
}

bool parse_layer_list(const std::string& text, std::vector<int>& layers, std::string& why) {
  layers.clear();
  if (text.find_first_not_of(" \t") == std::string::npos) return true;
  size_t start = 0;
  while (true) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    int v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      why = "'" + item + "' is not a whole number (expected e.g. 3,3,2,2)";
      return false;
    }
    if (v < 1) {
      why = "stage " + std::to_string(layers.size()) + " has " + item +
            " layers; every stage needs at least one";
      return false;
    }
    layers.push_back(v);
    if (comma == text.size()) return true;
    start = comma + 1;
  }
}

void check_stage_layers(const std::vector<int>& layers, int n_layer, int num_stages,
                        const std::string& text) {
  const std::string key =
      "parallel.stage_layers = '" + (text.empty() ? layers_text(layers) : text) + "'";
  auto fail = [&](const std::string& why) { throw CollectiveError(key + ": " + why, MESHLM_HERE); };
  if (static_cast<int>(layers.size()) != num_stages)
    fail("lists " + std::to_string(layers.size()) + " stages but parallel.pp = " +
         std::to_string(num_stages));
  long long sum = 0;
  for (int v : layers) sum += v;
  if (sum != n_layer)
    fail("holds " + std::to_string(sum) + " layers but model.n_layer = " + std::to_string(n_layer));
}

std::vector<int> parse_stage_layers(const std::string& text, int n_layer, int num_stages) {
  std::vector<int> layers;
  std::string why;
  const std::string key = "parallel.stage_layers = '" + text + "'";
  if (text.find_first_not_of(" \t") == std::string::npos)
    throw CollectiveError(key + ": empty; give the layers of every stage, e.g. 2,2", MESHLM_HERE);
  if (!parse_layer_list(text, layers, why)) throw CollectiveError(key + ": " + why, MESHLM_HERE);
  check_stage_layers(layers, n_layer, num_stages, text);
  return layers;
}

std::vector<int> stage_bounds(const std::vector<int>& layers_per_stage) {
  std::vector<int> bounds(layers_per_stage.size() + 1, 0);
  for (size_t k = 0; k < layers_per_stage.size(); ++k)
    bounds[k + 1] = bounds[k] + layers_per_stage[k];
  return bounds;
}

}  // namespace meshlm
