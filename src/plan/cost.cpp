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

namespace {

// What a stage's forward and backward of one micro-batch cost, alone on its
// rank's units: compute, and tp's all-reduces.
struct StagePass {
  double forward = 0, backward = 0;   // compute
  double ar_forward = 0, ar_backward = 0;  // tp's all-reduces
};

// The rates and shapes every stage of a layout shares.
class StageModel {
 public:
  StageModel(const GPTConfig& model, const ParallelConfig& p, const StepWork& w, const ClusterRates& rates,
             double tp_one)
      : p_(p), w_(w), o_(rates.ops), B_(w.micro_batch), T_(w.seq_len), C_(model.n_embd),
        V_(model.padded_vocab_size()), tp_(p.tp), tokens_(B_ * T_), tp_one_(tp_one),
        block_(model.block_matmul_elements()), mlp_(model.mlp_width()) {
    gemm_rate_ = rates.flops_per_s * gemm_efficiency(rates, tokens_, C_);
    const double head = C_ / model.n_head;
    const bool flash = w.attention == Attention::flash;
    att_f_rate_ = log_interpolate(flash ? o_.flash_forward : o_.attention_forward, head, gemm_rate_);
    att_b_rate_ = log_interpolate(flash ? o_.flash_backward : o_.attention_backward, head, gemm_rate_);
  }

  // A stage of L layers, the classifier's when `last`. Linear in L: what
  // balance_stages needs (stage_time_costs).
  StagePass pass(double L, bool last) const {
    const double B = B_, T = T_, C = C_, tp = tp_, tokens = tokens_;
    const bool recompute = p_.activation_checkpointing == Checkpointing::full;
    const double gemm = 2.0 * block_ * L * tokens / tp / gemm_rate_;
    const double cls = last ? 2.0 * V_ * C * tokens / tp / gemm_rate_ : 0;
    const double att_f = 4.0 * L * B * T * T * C / tp / att_f_rate_;
    const double att_b = 8.0 * L * B * T * T * C / tp / att_b_rate_;
    // The MLP's activation (GELU, or SwiGLU) over its width.
    const double gelu = mlp_ * tokens * L / tp * 1e-9;
    // The blocks' two LayerNorms each, and the final one before the classifier.
    const double norm_blocks = C * tokens * 2.0 * L * 1e-9, norm_final = last ? C * tokens * 1e-9 : 0;
    const double logits = tokens * V_ / tp * 1e-9;
    const double block_f = gemm + att_f + gelu * o_.gelu_forward_ns + norm_blocks * o_.norm_forward_ns;
    // A backward's GEMMs per forward one: the input's gradient and the
    // weight's, or only the input's under LoRA (its base is frozen).
    const double backward_gemms = w_.lora ? 1.0 : 2.0;
    // The classifier's backward runs in the last stage's forward, a chunk of
    // rows at a time as its logits are made (GPT::forward), so that a
    // pipeline's last stage sends nothing back until its backward proper.
    const double cls_b = last ? backward_gemms * cls + logits * o_.xent_backward_ns : 0;
    StagePass s;
    s.forward = block_f + cls + norm_final * o_.norm_forward_ns + (last ? logits * o_.xent_forward_ns : 0) +
                cls_b;
    s.backward = backward_gemms * gemm + att_b + gelu * o_.gelu_backward_ns +
                 (norm_blocks + norm_final) * o_.norm_backward_ns;
    // Checkpointing runs the blocks' forward again, not the final LayerNorm's.
    if (recompute) s.backward += block_f;
    // ZeRO 2 keeps no whole gradient of wte: its classifier part comes in
    // blocks of vocabulary rows after the rows' backward, each block's
    // logits computed again (GPT::head_wte_grad_blocks), in the forward too.
    if (p_.zero_stage == 2 && !w_.lora && last) s.forward += cls + logits * o_.xent_backward_ns;
    // tp: 2 all-reduces per layer each way, 2 more for the recomputed forward.
    s.ar_forward = 2.0 * L * tp_one_;
    s.ar_backward = (recompute ? 4.0 : 2.0) * L * tp_one_;
    return s;
  }

 private:
  const ParallelConfig& p_;
  const StepWork& w_;
  const OpClassRates& o_;
  double B_, T_, C_, V_, tp_, tokens_, tp_one_;
  double block_, mlp_;  // a block's linear weights' elements; the MLP's width
  double gemm_rate_ = 0, att_f_rate_ = 0, att_b_rate_ = 0;
};

// The bandwidth and latency of a layout's groups.
struct Links {
  double intra = 0, inter = 0;
  const ClusterRates* r = nullptr;
  double bw(bool one_node) const { return one_node ? intra : inter; }
  double lat(bool one_node) const { return one_node ? r->intra_latency_s : r->inter_latency_s; }
};

Links links_of(const ParallelConfig& p, const ClusterRates& rates, bool host_staged) {
  const int node_ranks = std::min(std::max(rates.ranks_per_node, 1), p.dp * p.tp * p.pp);
  Links l;
  l.r = &rates;
  l.intra = rates.node_memory_bytes_per_s > 0
                ? std::min(rates.intra_bytes_per_s, rates.node_memory_bytes_per_s / (4.0 * node_ranks))
                : rates.intra_bytes_per_s;
  l.inter = rates.inter_bytes_per_s;
  if (host_staged) {
    // A byte's time: the link's, and a copy to the host and one back.
    const double copies = 2.0 / rates.host_copy_bytes_per_s;
    l.intra = 1.0 / (1.0 / l.intra + copies);
    l.inter = 1.0 / (1.0 / l.inter + copies);
  }
  return l;
}

// One tp all-reduce of a micro-batch's (B, T, C) activations over `links`.
double tp_all_reduce(const GPTConfig& model, const ParallelConfig& p, const StepWork& w, const Links& links) {
  const bool tp_node = on_one_node(0, p.tp, 1, links.r->ranks_per_node);
  return all_reduce(double(w.micro_batch) * w.seq_len * model.n_embd * 4.0, p.tp, links.bw(tp_node),
                    links.lat(tp_node));
}

}  // namespace

std::pair<double, double> dp_overlap(double backward, int layers, double block_bytes,
                                     double edge_bytes, int micro_batches, bool each_micro_batch,
                                     double bucket_bytes,
                                     const std::function<double(double)>& seconds) {
  const int L = std::max(layers, 1), m = std::max(micro_batches, 1);
  const double per_layer = block_bytes / L, dt = backward / L;
  double free_at = 0, busy = 0;  // when the link is free; its busy seconds
  auto send = [&](double ready, double bytes) {
    if (bytes <= 0) return;
    const double d = seconds(bytes);
    free_at = std::max(free_at, ready) + d;
    busy += d;
  };
  for (int i = each_micro_batch ? 0 : m - 1; i < m; ++i) {
    const double start = i * backward;
    double pending = 0;
    for (int l = 0; l + 1 < L; ++l) {
      pending += per_layer;
      if (each_micro_batch || pending >= bucket_bytes) {
        send(start + (l + 1) * dt, pending);
        pending = 0;
      }
    }
    send(start + backward, pending + per_layer + edge_bytes);
  }
  const double exposed = std::max(0.0, free_at - m * backward);
  return {exposed, busy - exposed};
}

StageCosts stage_time_costs(const GPTConfig& model, const ParallelConfig& p, const StepWork& w,
                            const ClusterRates& rates) {
  const StageModel sm(model, p, w, rates, tp_all_reduce(model, p, w, links_of(p, rates, w.host_staged)));
  const StagePass layer = sm.pass(1, false), head = sm.pass(0, true);
  StageCosts c;
  c.layer = layer.forward + layer.backward + layer.ar_forward + layer.ar_backward;
  c.embedding = 0;  // a lookup and an add per token: outside the model
  c.head = head.forward + head.backward + head.ar_forward + head.ar_backward;
  return c;
}

StepCost estimate_step(const GPTConfig& model, const ParallelConfig& p,
                       const std::vector<int>& stage_layers, const StepWork& w,
                       const ClusterRates& rates) {
  const double tokens = double(w.micro_batch) * w.seq_len, C = model.n_embd;
  const int m = std::max(p.micro_batches, 1), pp = static_cast<int>(stage_layers.size());
  const OpClassRates& o = rates.ops;
  const int rpn = rates.ranks_per_node;
  const int node_ranks = std::min(std::max(rpn, 1), p.dp * p.tp * p.pp);
  const Links links = links_of(p, rates, w.host_staged);
  // Groups of rank 0: tp consecutive ranks, dp by a stride of tp, pp by tp * dp.
  const bool dp_node = on_one_node(0, p.dp, p.tp, rpn), pp_node = on_one_node(0, p.pp, p.tp * p.dp, rpn);
  const double act_bytes = tokens * C * 4.0;
  const StageModel sm(model, p, w, rates, tp_all_reduce(model, p, w, links));

  StepCost c;
  std::vector<double> fwd, bwd, comm;
  for (int s = 0; s < pp; ++s) {
    const StagePass sp = sm.pass(stage_layers[size_t(s)], s + 1 == pp);
    c.stage_seconds.push_back(sp.forward + sp.backward);
    fwd.push_back(sp.forward + sp.ar_forward);
    bwd.push_back(sp.backward + sp.ar_backward);
    comm.push_back(sp.ar_forward + sp.ar_backward);
  }
  const double send = pp > 1 ? act_bytes / p.tp / links.bw(pp_node) + links.lat(pp_node) : 0;
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
  if (w.overlap_dp && !w.host_staged && p.dp > 1) {
    // The reductions under the backward (dp_overlap), stage by stage: the
    // first stage finishes its last backward last; stage s about the
    // backwards and sends of the stages before it earlier, which its
    // exposed tail may use. Each stage's rank reduces the largest rank's
    // bytes; the first stage's token embedding (and GPT-2's position table)
    // is ready at the end of its backward, the rest layer by layer.
    const double bw = links.bw(dp_node), lat = links.lat(dp_node);
    const double R = w.reduced_bytes;
    double edge = 0;
    if (!w.lora) {
      edge = double(model.padded_vocab_size()) * C / p.tp;
      if (model.arch == ModelArch::gpt2) edge += double(model.max_seq_len) * C;
      edge = std::min(edge * 4.0, R);
    }
    // ZeRO 0 all-reduces; 1 and 2 reduce-scatter (half an all-reduce's
    // bytes and latencies) and all-gather the updated shards once, exposed.
    const auto seconds = [&](double bytes) {
      const double ar = all_reduce(bytes, p.dp, bw, lat);
      return p.zero_stage == 0 ? ar : ar / 2;
    };
    double exposed = 0, hidden = 0, lead = 0;
    for (int s = 0; s < pp; ++s) {
      const double e = s == 0 ? edge : 0;
      const auto [x, h] = dp_overlap(bwd[size_t(s)], stage_layers[size_t(s)], R - e, e, m,
                                     p.zero_stage == 2, w.bucket_bytes, seconds);
      if (s == 0 || x - lead > exposed) {
        exposed = std::max(0.0, x - lead);
        hidden = h + (x - exposed);
      }
      lead += bwd[size_t(s)] + send;
    }
    c.dp = exposed + (p.zero_stage == 0 ? 0 : all_reduce(R, p.dp, bw, lat) / 2);
    c.dp_hidden = hidden;
  } else if (p.zero_stage == 2) {
    // Each micro-batch's gradients go to their owners as its backward makes
    // them, a layer (or a block of wte's rows) at a time, waited for in the
    // backward (Zero::reduce_to_owners): m reduce-scatters' bytes at the
    // rate of those reductions (zero2_reduce_fraction of the link: 2 (dp -
    // 1) / dp of the bytes at fraction x bw, the link's own reduce-scatter at
    // 2) and a reduction's latencies for each layer and the edges; the
    // parameters' all-gather once.
    const double calls = *std::max_element(stage_layers.begin(), stage_layers.end()) + 2.0;
    const double bw = links.bw(dp_node);
    const double gather = all_reduce(w.reduced_bytes, p.dp, bw, 0) / 2;
    const double reduce = all_reduce(w.reduced_bytes, p.dp, rates.zero2_reduce_fraction * bw, 0);
    const double lat = links.lat(dp_node);
    c.dp = m * reduce + gather + m * calls * (p.dp - 1) * lat + (p.dp - 1) * lat;
  } else {
    c.dp = all_reduce(w.reduced_bytes, p.dp, links.bw(dp_node), links.lat(dp_node));
  }
  return c;
}

}  // namespace meshlm
