#include "plan/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "plan/pipeline_schedule.h"

namespace meshlm {

bool on_one_node(int first, int count, int stride, int ranks_per_node) {
  if (ranks_per_node < 1 || count <= 1) return true;
  const int last = first + (count - 1) * stride;
  return first / ranks_per_node == last / ranks_per_node;
}

double log_interpolate(const std::vector<std::pair<double, double>>& t, double x, double empty) {
  if (t.empty()) return empty;
  if (x <= t.front().first) return t.front().second;
  if (x >= t.back().first) return t.back().second;
  size_t i = 1;
  while (t[i].first < x) ++i;
  const double f = std::log(x / t[i - 1].first) / std::log(t[i].first / t[i - 1].first);
  return t[i - 1].second + f * (t[i].second - t[i - 1].second);
}

double gemm_efficiency(const ClusterRates& rates, double rows, double width) {
  if (rates.efficiency_by_width.empty()) return log_interpolate(rates.efficiency_by_rows, rows, 1.0);
  std::vector<std::pair<double, double>> at_rows;
  for (const auto& [w, table] : rates.efficiency_by_width)
    at_rows.emplace_back(w, log_interpolate(table, rows, 1.0));
  return log_interpolate(at_rows, width, 1.0);
}

namespace {

// Ring all-reduce of `bytes` over `n` ranks.
double all_reduce(double bytes, int n, double bandwidth, double latency) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / bandwidth + 2.0 * (n - 1) * latency;
}

// The speed (a fraction of alone) of each of `busy` ranks of one node.
double shared_speed(const ClusterRates& r, int busy) {
  if (busy <= 1 || r.units_per_node <= 0) return 1;
  const double load = double(busy) * r.units_per_rank / r.units_per_node;
  return std::min(1.0, 1.0 / load) * log_interpolate(r.sharing_efficiency, load, 1.0);
}

}  // namespace

double simulate_pipeline(PipelineSchedule kind, int micro_batches, const std::vector<double>& forward,
                         const std::vector<double>& backward, double send,
                         const std::vector<int>& node, int ranks_per_stage, const ClusterRates& rates) {
  const int p = static_cast<int>(forward.size()), m = micro_batches;
  constexpr double kNever = std::numeric_limits<double>::infinity();
  // Each stage's forwards and backwards in its order (the sends and
  // receives are the waits below).
  std::vector<std::vector<Action>> ops(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s)
    for (const Action& a : build_schedule(kind, s, p, m))
      if (a.kind == ActionKind::forward || a.kind == ActionKind::backward) ops[size_t(s)].push_back(a);
  // When each stage's forward / backward of micro-batch i ended.
  std::vector<std::vector<double>> f_end(size_t(p), std::vector<double>(size_t(m), kNever));
  std::vector<std::vector<double>> b_end = f_end;
  std::vector<size_t> next(size_t(p), 0);
  std::vector<double> left(size_t(p), -1);  // work left of the running op (at full speed); -1: none
  int nodes = 0;
  for (int n : node) nodes = std::max(nodes, n + 1);
  std::vector<int> busy(static_cast<size_t>(nodes), 0);
  double now = 0, end = 0;
  for (;;) {
    // Start what can start; find when the next waiting op can.
    double wake = kNever;
    bool any = false;
    for (int s = 0; s < p; ++s) {
      const size_t su = size_t(s);
      if (left[su] >= 0 || next[su] == ops[su].size()) continue;
      any = true;
      const Action a = ops[su][next[su]];
      const size_t i = size_t(a.micro);
      double ready = 0;
      if (a.kind == ActionKind::forward && s > 0) ready = f_end[su - 1][i] + send;
      if (a.kind == ActionKind::backward && s + 1 < p) ready = b_end[su + 1][i] + send;
      if (ready <= now) left[su] = a.kind == ActionKind::forward ? forward[su] : backward[su];
      else wake = std::min(wake, ready);
    }
    std::fill(busy.begin(), busy.end(), 0);
    for (int s = 0; s < p; ++s)
      if (left[size_t(s)] >= 0 || rates.waiting_ranks_poll) busy[size_t(node[size_t(s)])] += ranks_per_stage;
    double dt = wake - now;
    bool running = false;
    for (int s = 0; s < p; ++s)
      if (left[size_t(s)] >= 0) {
        running = true;
        dt = std::min(dt, left[size_t(s)] / shared_speed(rates, busy[size_t(node[size_t(s)])]));
      }
    if (!running) {
      if (!any || wake == kNever) break;  // done (a schedule cannot deadlock: its tests)
      now = wake;
      continue;
    }
    now += dt;
    for (int s = 0; s < p; ++s) {
      const size_t su = size_t(s);
      if (left[su] < 0) continue;
      const double full = ops[su][next[su]].kind == ActionKind::forward ? forward[su] : backward[su];
      left[su] -= dt * shared_speed(rates, busy[size_t(node[su])]);
      if (left[su] > 1e-12 * full) continue;
      const Action a = ops[su][next[su]++];
      (a.kind == ActionKind::forward ? f_end : b_end)[su][size_t(a.micro)] = now;
      left[su] = -1;
      end = std::max(end, now);
    }
  }
  return end;
}

StepCost estimate_step(const GPTConfig& model, const ParallelConfig& p,
                       const std::vector<int>& stage_layers, const StepWork& w,
                       const ClusterRates& rates) {
  const double B = w.micro_batch, T = w.seq_len, C = model.n_embd;
  const double V = model.padded_vocab_size(), tp = p.tp;
  const double tokens = B * T, head = C / model.n_head;
  const int m = std::max(p.micro_batches, 1), pp = static_cast<int>(stage_layers.size());
  const OpClassRates& o = rates.ops;
  const bool recompute = p.activation_checkpointing == Checkpointing::full;
  const double gemm_rate = rates.flops_per_s * gemm_efficiency(rates, tokens, C);
  const bool flash = w.attention == Attention::flash;
  const double att_f_rate = log_interpolate(flash ? o.flash_forward : o.attention_forward, head, gemm_rate);
  const double att_b_rate = log_interpolate(flash ? o.flash_backward : o.attention_backward, head, gemm_rate);

  const int rpn = rates.ranks_per_node;
  const int node_ranks = std::min(std::max(rpn, 1), p.dp * p.tp * p.pp);
  const double intra = rates.node_memory_bytes_per_s > 0
                           ? std::min(rates.intra_bytes_per_s,
                                      rates.node_memory_bytes_per_s / (4.0 * node_ranks))
                           : rates.intra_bytes_per_s;
  auto bw = [&](bool one_node) { return one_node ? intra : rates.inter_bytes_per_s; };
  auto lat = [&](bool one_node) { return one_node ? rates.intra_latency_s : rates.inter_latency_s; };
  // Groups of rank 0: tp consecutive ranks, dp by a stride of tp, pp by tp * dp.
  const bool tp_node = on_one_node(0, p.tp, 1, rpn), dp_node = on_one_node(0, p.dp, p.tp, rpn),
             pp_node = on_one_node(0, p.pp, p.tp * p.dp, rpn);
  const double act_bytes = tokens * C * 4.0;
  const double tp_one = all_reduce(act_bytes, p.tp, bw(tp_node), lat(tp_node));

  const bool zero2_blocks = p.zero_stage == 2 && !w.lora;
  StepCost c;
  std::vector<double> fwd, bwd, comm;
  for (int s = 0; s < pp; ++s) {
    const double L = stage_layers[size_t(s)];
    const bool last = s + 1 == pp;
    const double gemm = 2.0 * 12.0 * C * C * L * tokens / tp / gemm_rate;
    const double cls = last ? 2.0 * V * C * tokens / tp / gemm_rate : 0;
    const double att_f = 4.0 * L * B * T * T * C / tp / att_f_rate;
    const double att_b = 8.0 * L * B * T * T * C / tp / att_b_rate;
    const double gelu = 4.0 * C * tokens * L / tp * 1e-9;
    const double norm = C * tokens * (2.0 * L + (last ? 1 : 0)) * 1e-9;
    const double logits = tokens * V / tp * 1e-9;
    const double block_f = gemm + att_f + gelu * o.gelu_forward_ns + norm * o.norm_forward_ns;
    double f = block_f + cls + (last ? logits * o.xent_forward_ns : 0);
    double b = (w.lora ? 1.0 : 2.0) * (gemm + cls) + att_b + gelu * o.gelu_backward_ns +
               norm * o.norm_backward_ns + (last ? logits * o.xent_backward_ns : 0);
    if (recompute) b += block_f;
    // ZeRO 2 keeps no whole gradient of wte: its classifier part comes in
    // blocks of vocabulary rows after the rows' backward, each block's
    // logits computed again (GPT::head_wte_grad_blocks).
    if (zero2_blocks && last) b += cls + logits * o.xent_backward_ns;
    // tp: 2 all-reduces per layer each way, 2 more for the recomputed forward.
    const double ar_f = 2.0 * L * tp_one, ar_b = (recompute ? 4.0 : 2.0) * L * tp_one;
    c.stage_seconds.push_back(f + b);
    fwd.push_back(f + ar_f);
    bwd.push_back(b + ar_b);
    comm.push_back(ar_f + ar_b);
  }
  const double send = pp > 1 ? act_bytes / tp / bw(pp_node) + lat(pp_node) : 0;
  // The node of each stage (of its first rank) and the ranks it has there.
  const int per_stage = p.tp * p.dp;
  std::vector<int> node;
  for (int s = 0; s < pp; ++s) node.push_back(s * per_stage / std::max(rpn, 1));
  const int stage_on_node = std::min(per_stage, std::max(rpn, 1));
  const double makespan = simulate_pipeline(pp > 1 ? p.schedule : PipelineSchedule::gpipe, m, fwd, bwd,
                                            send, node, stage_on_node, rates);
  // The whole node busy: every rank's speed in the step's other parts.
  const double all_busy = shared_speed(rates, node_ranks);
  size_t slow = 0;
  for (size_t s = 0; s < c.stage_seconds.size(); ++s)
    if (c.stage_seconds[s] + comm[s] > c.stage_seconds[slow] + comm[slow]) slow = s;
  c.compute = m * c.stage_seconds[slow] / all_busy;
  c.tp = m * comm[slow] / all_busy;
  c.pp = 2.0 * (pp - 1) * send;  // the first forward down the pipe, the last backward up
  c.pipeline = makespan - c.compute - c.tp - c.pp;
  c.optimizer = w.updated_elements * o.adamw_ns * 1e-9 / all_busy;
  if (p.zero_stage == 2) {
    // Each micro-batch's gradients go to their owners as its backward makes
    // them, a layer (or a block of wte's rows) at a time, waited for in the
    // backward (Zero::reduce_to_owners): m reduce-scatters' bytes and a
    // reduction's latencies for each layer and the edges; the parameters'
    // all-gather once.
    const double calls = *std::max_element(stage_layers.begin(), stage_layers.end()) + 2.0;
    const double half = all_reduce(w.reduced_bytes, p.dp, bw(dp_node), 0) / 2;
    c.dp = (m + 1) * half + m * calls * (p.dp - 1) * lat(dp_node) + (p.dp - 1) * lat(dp_node);
  } else {
    c.dp = all_reduce(w.reduced_bytes, p.dp, bw(dp_node), lat(dp_node));
  }
  return c;
}

}  // namespace meshlm
