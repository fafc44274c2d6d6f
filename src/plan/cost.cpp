#include "plan/cost.h"

#include <algorithm>
#include <cmath>

namespace meshlm {

bool on_one_node(int first, int count, int stride, int ranks_per_node) {
  if (ranks_per_node < 1 || count <= 1) return true;
  const int last = first + (count - 1) * stride;
  return first / ranks_per_node == last / ranks_per_node;
}

double gemm_efficiency(const ClusterRates& rates, double rows) {
  const auto& t = rates.efficiency_by_rows;
  if (t.empty()) return 1;
  if (rows <= t.front().first) return t.front().second;
  if (rows >= t.back().first) return t.back().second;
  size_t i = 1;
  while (t[i].first < rows) ++i;
  const double x = std::log(rows / t[i - 1].first) / std::log(t[i].first / t[i - 1].first);
  return t[i - 1].second + x * (t[i].second - t[i - 1].second);
}

namespace {

// Ring all-reduce of `bytes` over `n` ranks.
double all_reduce(double bytes, int n, double bandwidth, double latency) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / bandwidth + 2.0 * (n - 1) * latency;
}

}  // namespace

StepCost estimate_step(const GPTConfig& model, const ParallelConfig& p,
                       const std::vector<int>& stage_layers, int micro_batch, int seq_len,
                       bool lora, double reduced_bytes, const ClusterRates& rates) {
  const double B = micro_batch, T = seq_len, C = model.n_embd;
  const double V = model.padded_vocab_size();
  const double tokens = B * T;
  // GEMM FLOPs per token and parameter: forward 2, backward 2 (the
  // activations' gradient) + 2 (the weights', full training only).
  const double per_param = lora ? 4.0 : 6.0;
  const double block_params = 12.0 * C * C;  // qkv 3C^2, proj C^2, mlp 8C^2
  const int m = std::max(p.micro_batches, 1);
  StepCost c;
  for (size_t s = 0; s < stage_layers.size(); ++s) {
    const double L = stage_layers[s];
    double flops = per_param * block_params * L * tokens + 12.0 * L * B * T * T * C;
    if (p.activation_checkpointing == Checkpointing::full)
      flops += (2.0 * block_params * L * tokens + 4.0 * L * B * T * T * C);  // the forward again
    if (s + 1 == stage_layers.size()) flops += per_param * V * C * tokens;  // the classifier
    c.stage_seconds.push_back(flops / p.tp / (rates.flops_per_s * gemm_efficiency(rates, tokens)));
  }
  const double slowest = *std::max_element(c.stage_seconds.begin(), c.stage_seconds.end());
  c.compute = m * slowest;
  c.pipeline_bubble = (p.pp - 1) * slowest;
  const int rpn = rates.ranks_per_node;
  auto bw = [&](bool one_node) { return one_node ? rates.intra_bytes_per_s : rates.inter_bytes_per_s; };
  auto lat = [&](bool one_node) { return one_node ? rates.intra_latency_s : rates.inter_latency_s; };
  // Groups of rank 0: tp consecutive ranks, dp by a stride of tp, pp by tp * dp.
  const bool tp_node = on_one_node(0, p.tp, 1, rpn), dp_node = on_one_node(0, p.dp, p.tp, rpn),
             pp_node = on_one_node(0, p.pp, p.tp * p.dp, rpn);
  const double act_bytes = tokens * C * 4.0;
  int layers_max = 0;
  for (int L : stage_layers) layers_max = std::max(layers_max, L);
  c.tp = (m + p.pp - 1) * 4.0 * layers_max * all_reduce(act_bytes, p.tp, bw(tp_node), lat(tp_node));
  if (p.pp > 1) c.pp = (m + p.pp - 1) * 2.0 * (act_bytes / p.tp / bw(pp_node) + lat(pp_node));
  c.dp = all_reduce(reduced_bytes, p.dp, bw(dp_node), lat(dp_node));
  return c;
}

}  // namespace meshlm
