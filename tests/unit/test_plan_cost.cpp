// The planner's cost model (plan/cost.h) against the same arithmetic written
// out by hand for GPT-2 124M-sized layers, and the properties a ranking
// relies on: tp divides the compute, the pipeline's schedule adds its bubble
// (worked out by hand for small cases, shared cores included), checkpointing
// adds a forward, groups within a node use its bandwidth, the ops outside
// GEMMs count per element, a DP reduction overlapped with the backward
// hides what the backward's length allows.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "plan/cost.h"

using namespace meshlm;

namespace {

GPTConfig gpt2() {
  GPTConfig m;
  m.n_layer = 12;
  m.n_head = 12;
  m.n_embd = 768;
  m.vocab_size = 50257;
  m.max_seq_len = 1024;
  return m;
}

StepWork work(int micro_batch, int seq_len, bool lora = false, double reduced = 0) {
  StepWork w;
  w.micro_batch = micro_batch;
  w.seq_len = seq_len;
  w.lora = lora;
  w.reduced_bytes = reduced;
  return w;
}

ParallelConfig layout(int dp, int tp, int pp, int m) {
  ParallelConfig p;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.micro_batches = m;
  return p;
}

}  // namespace

TEST(PlanCost, OneRankIsTheFlopsOverTheRate) {
  ClusterRates r;
  r.flops_per_s = 1e12;
  const GPTConfig m = gpt2();
  const StepCost c = estimate_step(m, layout(1, 1, 1, 2), {12}, work(4, 1024, false, 0), r);
  // By hand: 6 x 12 C^2 x 12 layers x tokens + 12 x 12 x B T^2 C + 6 V C tokens,
  // V padded to 50304, per micro-batch of 4 x 1024 tokens, 2 micro-batches.
  const double C = 768, tokens = 4096, V = 50304;
  const double flops = 6 * 12 * C * C * 12 * tokens + 12.0 * 12 * 4 * 1024.0 * 1024 * C + 6 * V * C * tokens;
  EXPECT_NEAR(c.compute, 2 * flops / 1e12, 1e-9);
  EXPECT_NEAR(c.pipeline, 0, 1e-12);
  EXPECT_EQ(c.optimizer, 0);  // no rate for AdamW: inside the GEMMs' rate
  EXPECT_EQ(c.tp, 0);
  EXPECT_EQ(c.pp, 0);
  EXPECT_EQ(c.dp, 0);
  // LoRA: 4 FLOPs per parameter and token instead of 6 (no weight gradient).
  const StepCost lora = estimate_step(m, layout(1, 1, 1, 2), {12}, work(4, 1024, true, 0), r);
  const double lflops = 4 * 12 * C * C * 12 * tokens + 12.0 * 12 * 4 * 1024.0 * 1024 * C + 4 * V * C * tokens;
  EXPECT_NEAR(lora.compute, 2 * lflops / 1e12, 1e-9);
}

TEST(PlanCost, SmallMicroBatchesRunAtTheirRowsEfficiency) {
  ClusterRates r;
  r.flops_per_s = 1e12;
  r.efficiency_by_rows = {{1024, 0.5}, {4096, 1.0}};
  EXPECT_DOUBLE_EQ(gemm_efficiency(r, 512, 768), 0.5);    // below the table: its first
  EXPECT_DOUBLE_EQ(gemm_efficiency(r, 8192, 768), 1.0);   // above: its last
  EXPECT_NEAR(gemm_efficiency(r, 2048, 768), 0.75, 1e-12);  // halfway in log(rows)
  EXPECT_DOUBLE_EQ(gemm_efficiency(ClusterRates{}, 7, 768), 1.0);
  // By width too: each width's rows, then between widths in log(width).
  ClusterRates w = r;
  w.efficiency_by_width = {{256, {{1024, 0.4}, {4096, 0.6}}}, {1024, {{1024, 0.8}}}};
  EXPECT_NEAR(gemm_efficiency(w, 2048, 256), 0.5, 1e-12);
  EXPECT_NEAR(gemm_efficiency(w, 2048, 512), 0.65, 1e-12);  // halfway between 0.5 and 0.8
  EXPECT_NEAR(gemm_efficiency(w, 2048, 4096), 0.8, 1e-12);
  // B = 2 x T = 1024 rows at 0.75 of the rate: the same FLOPs take 4/3 as long
  // as without the table.
  const GPTConfig m = gpt2();
  ClusterRates flat = r;
  flat.efficiency_by_rows.clear();
  const StepCost slow = estimate_step(m, layout(1, 1, 1, 4), {12}, work(2, 1024, false, 0), r);
  const StepCost fast = estimate_step(m, layout(1, 1, 1, 4), {12}, work(2, 1024, false, 0), flat);
  EXPECT_NEAR(slow.compute, fast.compute / 0.75, 1e-12 * fast.compute);
}

TEST(PlanCost, ParallelismDividesComputeAndAddsItsCosts) {
  ClusterRates r;
  r.ranks_per_node = 8;
  const GPTConfig m = gpt2();
  const StepCost one = estimate_step(m, layout(1, 1, 1, 8), {12}, work(2, 1024, false, 0), r);
  const StepCost tp2 = estimate_step(m, layout(1, 2, 1, 8), {12}, work(2, 1024, false, 0), r);
  EXPECT_NEAR(tp2.compute, one.compute / 2, 1e-12);
  EXPECT_GT(tp2.tp, 0);
  // 4 all-reduces per layer and micro-batch: ring 2 (tp-1)/tp of B T C floats.
  const double bytes = 2.0 * 1024 * 768 * 4;
  EXPECT_NEAR(tp2.tp, 8 * 4 * 12 * (bytes / r.intra_bytes_per_s + 2 * r.intra_latency_s), 1e-12);
  // pp 2 of 6 + 6 layers: the slowest stage (1) holds the classifier and
  // runs its 8 micro-batches back to back; stage 0's first forward comes
  // before them and its last backward after: the bubble is stage 0's
  // forward and backward, and a send each way.
  const StepCost pp2 = estimate_step(m, layout(1, 1, 2, 8), {6, 6}, work(2, 1024), r);
  EXPECT_GT(pp2.stage_seconds[1], pp2.stage_seconds[0]);
  EXPECT_NEAR(pp2.compute, 8 * pp2.stage_seconds[1], 1e-12);
  EXPECT_NEAR(pp2.pipeline, pp2.stage_seconds[0], 1e-9);
  EXPECT_NEAR(pp2.pp, 2 * (2048.0 * 768 * 4 / r.intra_bytes_per_s + r.intra_latency_s), 1e-12);
  EXPECT_LT(pp2.compute, one.compute);
  EXPECT_GT(pp2.pp, 0);
  // Checkpointing recomputes the blocks' forward.
  ParallelConfig ck = layout(1, 1, 1, 8);
  ck.activation_checkpointing = Checkpointing::full;
  EXPECT_GT(estimate_step(m, ck, {12}, work(2, 1024, false, 0), r).compute, one.compute);
  // dp: the gradients' ring all-reduce.
  const StepCost dp4 = estimate_step(m, layout(4, 1, 1, 2), {12}, work(2, 1024, false, 1e9), r);
  EXPECT_NEAR(dp4.dp, 2.0 * 3 / 4 * 1e9 / r.intra_bytes_per_s + 6 * r.intra_latency_s, 1e-12);
  // Within a node of 8 GB/s of memory, 4 ranks reducing at once each copy
  // at most 8 / (4 x 4) GB/s (two copies, each read and written).
  ClusterRates shm = r;
  shm.ranks_per_node = 4;
  shm.node_memory_bytes_per_s = 8e9;
  const StepCost dp4m = estimate_step(m, layout(4, 1, 1, 2), {12}, work(2, 1024, false, 1e9), shm);
  EXPECT_NEAR(dp4m.dp, 2.0 * 3 / 4 * 1e9 / 0.5e9 + 6 * r.intra_latency_s, 1e-12);
}

// ZeRO 2 (Zero::reduce_to_owners, GPT::head_wte_grad_blocks): every
// micro-batch's gradients go to their owners in the backward, a layer at a
// time, and wte's gradient comes in blocks of rows whose logits are computed
// again. Worked out by hand against ZeRO 1 on the same layout.
TEST(PlanCost, ZeroTwoReducesEachMicroBatchAndRecomputesTheLogits) {
  ClusterRates r;
  r.flops_per_s = 1e12;
  r.ops.xent_backward_ns = 0.5;
  r.ranks_per_node = 8;  // the dp group within a node
  const GPTConfig m = gpt2();
  const double bytes = 1e9, bw = r.intra_bytes_per_s, lat = r.intra_latency_s;
  ParallelConfig z1 = layout(4, 1, 1, 3), z2 = layout(4, 1, 1, 3);
  z1.zero_stage = 1;
  z2.zero_stage = 2;
  const StepCost one = estimate_step(m, z1, {12}, work(2, 1024, false, bytes), r);
  const StepCost two = estimate_step(m, z2, {12}, work(2, 1024, false, bytes), r);
  // ZeRO 1: one ring all-reduce's bytes and latencies per step.
  EXPECT_NEAR(one.dp, 2.0 * 3 / 4 * bytes / bw + 6 * lat, 1e-12);
  // ZeRO 2: 3 reduce-scatters and one all-gather of 3/4 of the bytes; per
  // micro-batch 12 layers + 2 edges reductions of 3 latencies; the gather's 3.
  EXPECT_NEAR(two.dp, 4 * 3.0 / 4 * bytes / bw + 3 * 14 * 3 * lat + 3 * lat, 1e-12);
  // A calibration's reductions to owners at 0.5 x the link: each
  // micro-batch's 2 x 3/4 of the bytes at bw / 2, the all-gather as before.
  ClusterRates slow = r;
  slow.zero2_reduce_fraction = 0.5;
  const StepCost two_slow = estimate_step(m, z2, {12}, work(2, 1024, false, bytes), slow);
  EXPECT_NEAR(two_slow.dp,
              3 * 2 * 3.0 / 4 * bytes / (0.5 * bw) + 3.0 / 4 * bytes / bw + 3 * 14 * 3 * lat + 3 * lat, 1e-12);
  EXPECT_DOUBLE_EQ(two_slow.compute, two.compute);
  // The classifier's forward (2 V C per token) and the cross-entropy's
  // backward (per logit) again, per micro-batch of 2048 tokens.
  const double V = 50304, C = 768, tokens = 2048;
  EXPECT_NEAR(two.compute - one.compute, 3 * (2 * V * C * tokens / 1e12 + tokens * V * 0.5e-9), 1e-9);
  // Under LoRA no wte gradient: no blocks, the compute of ZeRO 1.
  EXPECT_NEAR(estimate_step(m, z2, {12}, work(2, 1024, true, bytes), r).compute,
              estimate_step(m, z1, {12}, work(2, 1024, true, bytes), r).compute, 1e-12);
  // Only the stage with the classifier recomputes it.
  ParallelConfig p1 = layout(1, 1, 2, 4), p2 = layout(1, 1, 2, 4);
  p2.zero_stage = 2;
  const StepCost s1 = estimate_step(m, p1, {6, 6}, work(2, 1024), r);
  const StepCost s2 = estimate_step(m, p2, {6, 6}, work(2, 1024), r);
  EXPECT_DOUBLE_EQ(s2.stage_seconds[0], s1.stage_seconds[0]);
  EXPECT_GT(s2.stage_seconds[1], s1.stage_seconds[1]);
}

TEST(PlanCost, GroupsAcrossNodesUseTheNetwork) {
  EXPECT_TRUE(on_one_node(0, 4, 1, 8));
  EXPECT_FALSE(on_one_node(0, 4, 4, 8));  // ranks 0, 4, 8, 12
  EXPECT_TRUE(on_one_node(8, 2, 4, 16));
  ClusterRates r;
  r.ranks_per_node = 2;
  r.intra_bytes_per_s = 100e9;
  r.inter_bytes_per_s = 1e9;
  const GPTConfig m = gpt2();
  // dp 4 over nodes of 2: the reduction crosses the network.
  const StepCost across = estimate_step(m, layout(4, 1, 1, 1), {12}, work(1, 1024, false, 1e9), r);
  r.ranks_per_node = 4;
  const StepCost within = estimate_step(m, layout(4, 1, 1, 1), {12}, work(1, 1024, false, 1e9), r);
  EXPECT_GT(across.dp, 50 * within.dp);
}

TEST(PlanCost, ThePipelineScheduleRunsAsWorkedOutByHand) {
  ClusterRates own;  // every rank on units of its own
  // 1F1B, 4 stages of forward 1 and backward 2, 4 micro-batches: the
  // textbook (m + p - 1) slots of forward + backward.
  EXPECT_NEAR(simulate_pipeline(PipelineSchedule::one_f_one_b, 4, {1, 1, 1, 1}, {2, 2, 2, 2}, 0,
                                {0, 1, 2, 3}, 1, own),
              21, 1e-9);
  // GPipe, 2 stages, 2 micro-batches, a send of 0.25: stage 0's F0 [0, 1]
  // and F1 [1, 2]; stage 1's F0 [1.25, 2.25], F1 [2.25, 3.25], B0 [3.25,
  // 5.25], B1 [5.25, 7.25]; stage 0's B0 [5.5, 7.5], B1 [7.5, 9.5].
  EXPECT_NEAR(simulate_pipeline(PipelineSchedule::gpipe, 2, {1, 1}, {2, 2}, 0.25, {0, 1}, 1, own),
              9.5, 1e-9);
  // The same two stages on one core of one node: stage 0's F1 and stage
  // 1's F0 share it ([1, 3]), stage 1's F1 and B0 run alone ([3, 6]), then
  // stage 1's B1 and stage 0's B0 share it ([6, 10]), stage 0's B1 alone:
  // 12, the whole work, as the core is never idle.
  ClusterRates one_core;
  one_core.units_per_node = 1;
  EXPECT_NEAR(simulate_pipeline(PipelineSchedule::gpipe, 2, {1, 1}, {2, 2}, 0, {0, 0}, 1, one_core),
              12, 1e-9);
  // Two cores and a rank of one thread per stage: nothing shared, as own.
  ClusterRates two_cores = one_core;
  two_cores.units_per_node = 2;
  EXPECT_NEAR(simulate_pipeline(PipelineSchedule::gpipe, 2, {1, 1}, {2, 2}, 0, {0, 0}, 1, two_cores), 9,
              1e-9);
  // Sharing at a measured loss: two busy ranks on one core each get 0.8 of
  // half of it.
  one_core.sharing_efficiency = {{2, 0.8}};
  EXPECT_NEAR(simulate_pipeline(PipelineSchedule::gpipe, 2, {1, 1}, {2, 2}, 0, {0, 0}, 1, one_core),
              1 + 2 / 0.8 + 3 + 4 / 0.8 + 2, 1e-9);
  // Ranks that poll while they wait (MPI on the CPU) keep their share: both
  // stages always take half of the core, twice the unshared schedule.
  ClusterRates polling;
  polling.units_per_node = 1;
  polling.waiting_ranks_poll = true;
  EXPECT_NEAR(simulate_pipeline(PipelineSchedule::gpipe, 2, {1, 1}, {2, 2}, 0, {0, 0}, 1, polling),
              18, 1e-9);
  // One stage: its micro-batches one after another.
  EXPECT_NEAR(simulate_pipeline(PipelineSchedule::gpipe, 5, {1}, {2}, 0, {0}, 1, own), 15, 1e-9);
}

TEST(PlanCost, OpsOutsideGemmsCountPerElement) {
  const GPTConfig m = gpt2();
  ClusterRates r;
  r.flops_per_s = 1e12;
  const StepCost base = estimate_step(m, layout(1, 1, 1, 1), {12}, work(4, 1024), r);
  // GELU at 1 ns forward and 2 backward per element of (B T, 4C), 12 layers.
  ClusterRates g = r;
  g.ops.gelu_forward_ns = 1;
  g.ops.gelu_backward_ns = 2;
  const StepCost gelu = estimate_step(m, layout(1, 1, 1, 1), {12}, work(4, 1024), g);
  EXPECT_NEAR(gelu.compute - base.compute, 3e-9 * 4096 * 4 * 768 * 12, 1e-12);
  // LayerNorm is not divided by tp (each rank normalises the whole C); GELU is.
  ClusterRates n = r;
  n.ops.norm_forward_ns = 1;
  ParallelConfig tp2 = layout(1, 2, 1, 1);
  const StepCost norm2 = estimate_step(m, tp2, {12}, work(4, 1024), n);
  const StepCost base2 = estimate_step(m, tp2, {12}, work(4, 1024), r);
  EXPECT_NEAR(norm2.compute - base2.compute, 1e-9 * 4096 * 768 * 25, 1e-12);
  const StepCost gelu2 = estimate_step(m, tp2, {12}, work(4, 1024), g);
  EXPECT_NEAR(gelu2.compute - base2.compute, (gelu.compute - base.compute) / 2, 1e-12);
  // Under checkpointing the backward runs the forward's GELU again.
  ParallelConfig ck = layout(1, 1, 1, 1);
  ck.activation_checkpointing = Checkpointing::full;
  const StepCost ckb = estimate_step(m, ck, {12}, work(4, 1024), r);
  const StepCost ckg = estimate_step(m, ck, {12}, work(4, 1024), g);
  EXPECT_NEAR(ckg.compute - ckb.compute, 4e-9 * 4096 * 4 * 768 * 12, 1e-12);
  // AdamW per updated element, once per step.
  ClusterRates a = r;
  a.ops.adamw_ns = 2;
  StepWork w = work(4, 1024);
  w.updated_elements = 1e6;
  EXPECT_NEAR(estimate_step(m, layout(1, 1, 1, 1), {12}, w, a).optimizer, 2e-3, 1e-15);
  // The attention at its own rate by head size (64 here) when it has one.
  ClusterRates at = r;
  at.ops.attention_forward = {{32, 1e11}, {128, 4e11}};  // 2.5e11 at 64, halfway in log
  at.ops.attention_backward = {{64, 1e11}};
  const StepCost att = estimate_step(m, layout(1, 1, 1, 1), {12}, work(4, 1024), at);
  const double fwd = 4.0 * 12 * 4 * 1024.0 * 1024 * 768, bwd = 2 * fwd;
  EXPECT_NEAR(att.compute - base.compute, fwd / 2.5e11 + bwd / 1e11 - (fwd + bwd) / 1e12, 1e-9);
}

TEST(PlanCost, StageTimeCostsAreTheStagesEstimatesPerLayerAndClassifier) {
  const GPTConfig m = gpt2();
  ClusterRates r;
  r.flops_per_s = 1e12;
  r.ops.gelu_forward_ns = 1;
  r.ops.gelu_backward_ns = 2;
  r.ops.norm_forward_ns = 1;
  r.ops.xent_forward_ns = 1;
  r.ops.xent_backward_ns = 2;
  const double C = 768, V = 50304, tokens = 4096, B = 4, T = 1024;
  // By hand, one micro-batch of 4 x 1024 forward and backward: a layer's
  // GEMMs and attention products, GELU over (B T, 4C), two LayerNorms'
  // forward; the classifier's GEMMs, the cross-entropy per logit, the final
  // LayerNorm's forward.
  const double layer = 6 * 12 * C * C * tokens / 1e12 + 12 * B * T * T * C / 1e12 + 3e-9 * tokens * 4 * C +
                       2e-9 * tokens * C;
  const double head = 6 * V * C * tokens / 1e12 + 3e-9 * tokens * V + 1e-9 * tokens * C;
  ParallelConfig p = layout(1, 1, 2, 4);
  const StageCosts c = stage_time_costs(m, p, work(4, 1024), r);
  EXPECT_NEAR(c.layer, layer, 1e-9 * layer);
  EXPECT_NEAR(c.head, head, 1e-9 * head);
  EXPECT_EQ(c.embedding, 0);
  // The estimate's stages are these sums, whatever the split.
  for (const std::vector<int>& split : {std::vector<int>{9, 3}, std::vector<int>{6, 6}, std::vector<int>{11, 1}}) {
    const StepCost s = estimate_step(m, p, split, work(4, 1024), r);
    EXPECT_NEAR(s.stage_seconds[0], split[0] * c.layer, 1e-9 * s.stage_seconds[0]);
    EXPECT_NEAR(s.stage_seconds[1], split[1] * c.layer + c.head, 1e-9 * s.stage_seconds[1]);
  }
  // ZeRO 2 runs the classifier's forward and the cross-entropy's backward
  // again; a layer is unchanged.
  ParallelConfig z = p;
  z.zero_stage = 2;
  const StageCosts cz = stage_time_costs(m, z, work(4, 1024), r);
  EXPECT_NEAR(cz.layer, c.layer, 1e-9 * layer);
  EXPECT_NEAR(cz.head - c.head, 2 * V * C * tokens / 1e12 + 2e-9 * tokens * V, 1e-9 * head);
  // Checkpointing adds a layer's forward to each layer, not to the classifier.
  ParallelConfig ck = p;
  ck.activation_checkpointing = Checkpointing::full;
  const StageCosts cc = stage_time_costs(m, ck, work(4, 1024), r);
  EXPECT_NEAR(cc.layer - c.layer,
              2 * 12 * C * C * tokens / 1e12 + 4 * B * T * T * C / 1e12 + 1e-9 * tokens * 4 * C +
                  2e-9 * tokens * C,
              1e-9 * layer);
  EXPECT_NEAR(cc.head, c.head, 1e-9 * head);
  // tp halves the compute and adds each layer's four all-reduces of (B, T, C).
  r.intra_bytes_per_s = 1e10;
  r.intra_latency_s = 1e-6;
  r.ranks_per_node = 8;
  ParallelConfig t = layout(1, 2, 2, 4);
  const StageCosts ct = stage_time_costs(m, t, work(4, 1024), r);
  const double ar = 2.0 * 1 / 2 * tokens * C * 4 / 1e10 + 2 * 1e-6;
  // LayerNorms are not divided by tp.
  EXPECT_NEAR(ct.layer, (layer - 2e-9 * tokens * C) / 2 + 2e-9 * tokens * C + 4 * ar, 1e-9 * layer);
  EXPECT_NEAR(ct.head, (head - 1e-9 * tokens * C) / 2 + 1e-9 * tokens * C, 1e-9 * head);
}

TEST(PlanCost, TheLastStagesForwardCarriesTheClassifiersBackward) {
  // GPT::forward runs the classifier's backward (and the cross-entropy's) as
  // it makes each chunk of logits, so a pipeline's last stage spends it in
  // its forwards: under GPipe its backwards start that much later.
  const GPTConfig m = gpt2();
  ClusterRates r;
  r.flops_per_s = 1e12;
  r.intra_bytes_per_s = r.inter_bytes_per_s = 1e30;  // sends that cost nothing
  r.intra_latency_s = r.inter_latency_s = 0;
  const double C = 768, V = 50304, tokens = 4096, B = 4, T = 1024;
  const double layer_f = (2 * 12 * C * C * tokens + 4 * B * T * T * C) / 1e12;
  const double layer_b = (4 * 12 * C * C * tokens + 8 * B * T * T * C) / 1e12;
  const double head_f = 2 * V * C * tokens / 1e12, head_b = 4 * V * C * tokens / 1e12;
  ParallelConfig p = layout(1, 1, 2, 4);
  p.schedule = PipelineSchedule::gpipe;
  // Stages 9, 3: stage 0's forward f0 is shorter than stage 1's (three
  // layers and the classifier both ways), its backward b0 longer than
  // stage 1's b1. Stage 1's forwards end at f0 + 4 f1, its backwards follow
  // one b1 apart, and stage 0's four backwards run from the first of them.
  const double f0 = 9 * layer_f, b0 = 9 * layer_b;
  const double f1 = 3 * layer_f + head_f + head_b, b1 = 3 * layer_b;
  ASSERT_GT(f1, f0);
  ASSERT_GT(b0, b1);
  const StepCost s = estimate_step(m, p, {9, 3}, work(4, 1024), r);
  EXPECT_NEAR(s.total(), f0 + 4 * f1 + b1 + 4 * b0, 1e-9 * s.total());
  // Counted in stage 1's backward instead, the classifier would let stage
  // 1's forwards keep pace with stage 0's: 4 f0 + (f1 - head_b) + (b1 +
  // head_b) + 4 b0, about 15% shorter.
  EXPECT_GT(s.total(), 1.1 * (4 * f0 + f1 + b1 + 4 * b0));
}

// dp_overlap on cases worked out by hand: a byte takes a second on the link
// (or 1.5), a layer's backward a second.
TEST(PlanCost, OverlappedReductionRunsBucketByBucketUnderTheBackward) {
  const auto per_byte = [](double b) { return b; };
  // 4 layers, a byte each, buckets of 2: layers 4 and 3 go at t = 2 (link
  // busy 2-4), layers 2 and 1 at the end, t = 4 (4-6): 2 s after the
  // backward, 2 under it.
  auto [x, h] = dp_overlap(4, 4, 4, 0, 1, false, 2, per_byte);
  EXPECT_DOUBLE_EQ(x, 2);
  EXPECT_DOUBLE_EQ(h, 2);
  // Only the last micro-batch's gradients go (ZeRO 0 and 1): two backwards
  // before it change nothing but when it ends.
  std::tie(x, h) = dp_overlap(4, 4, 4, 0, 3, false, 2, per_byte);
  EXPECT_DOUBLE_EQ(x, 2);
  EXPECT_DOUBLE_EQ(h, 2);
  // The edge (the first stage's embedding) comes at the end, with the last bucket.
  std::tie(x, h) = dp_overlap(4, 4, 4, 3, 1, false, 2, per_byte);
  EXPECT_DOUBLE_EQ(x, 5);
  EXPECT_DOUBLE_EQ(h, 2);
  // One bucket for everything: nothing hidden.
  std::tie(x, h) = dp_overlap(4, 4, 4, 0, 1, false, 100, per_byte);
  EXPECT_DOUBLE_EQ(x, 4);
  EXPECT_DOUBLE_EQ(h, 0);
  // Every micro-batch, layer by layer (ZeRO 2), at 1.5 s a byte, 2 layers of
  // a byte each, 2 micro-batches of 2 s: 1-2.5, 2.5-4, 4-5.5, 5.5-7; the
  // backwards end at 4.
  std::tie(x, h) = dp_overlap(2, 2, 2, 0, 2, true, 0, [](double b) { return 1.5 * b; });
  EXPECT_DOUBLE_EQ(x, 3);
  EXPECT_DOUBLE_EQ(h, 3);
  // A link faster than the backward hides all but the last layer.
  std::tie(x, h) = dp_overlap(8, 8, 8, 0, 1, false, 1, [](double b) { return 0.5 * b; });
  EXPECT_DOUBLE_EQ(x, 0.5);
  EXPECT_DOUBLE_EQ(h, 3.5);
}

// estimate_step with the overlap: ZeRO 0's all-reduce in buckets, its
// exposed and hidden parts adding up to the reduction's time (with a
// latency per bucket); one bucket for all of it is the reduction without
// overlap; smaller buckets hide more; ZeRO 1's all-gather stays exposed.
TEST(PlanCost, OverlapSplitsTheReductionIntoExposedAndHidden) {
  ClusterRates r;
  r.flops_per_s = 100e12;
  r.inter_bytes_per_s = 50e9;
  r.inter_latency_s = 0;
  r.ranks_per_node = 1;  // every group between nodes
  const GPTConfig m = gpt2();
  const double R = 124e6 * 4;
  StepWork w = work(8, 1024, false, R);
  const StepCost plain = estimate_step(m, layout(8, 1, 1, 1), {12}, w, r);
  EXPECT_EQ(plain.dp_hidden, 0);
  EXPECT_NEAR(plain.dp, 2.0 * 7 / 8 * R / 50e9, 1e-12);
  w.overlap_dp = true;
  w.bucket_bytes = 1e12;  // one bucket
  const StepCost one = estimate_step(m, layout(8, 1, 1, 1), {12}, w, r);
  EXPECT_NEAR(one.dp, plain.dp, 1e-12);
  EXPECT_NEAR(one.dp_hidden, 0, 1e-12);
  w.bucket_bytes = 25e6;
  const StepCost small = estimate_step(m, layout(8, 1, 1, 1), {12}, w, r);
  EXPECT_NEAR(small.dp + small.dp_hidden, plain.dp, 1e-9);
  EXPECT_LT(small.dp, 0.5 * plain.dp);
  EXPECT_GT(small.dp_hidden, 0);
  EXPECT_NEAR(small.total() - small.dp, plain.total() - plain.dp, 1e-12);  // nothing else moves
  // ZeRO 1: half the bytes go under the backward, the all-gather after it.
  ParallelConfig z1 = layout(8, 1, 1, 1);
  z1.zero_stage = 1;
  const StepCost zero1 = estimate_step(m, z1, {12}, w, r);
  EXPECT_NEAR(zero1.dp + zero1.dp_hidden, plain.dp, 1e-9);
  EXPECT_GE(zero1.dp, plain.dp / 2 - 1e-12);
  // One rank over dp: nothing to reduce.
  const StepCost alone = estimate_step(m, layout(1, 1, 1, 1), {12}, w, r);
  EXPECT_EQ(alone.dp, 0);
  EXPECT_EQ(alone.dp_hidden, 0);
}

// Host staging: nothing overlaps, and every byte of a group's link also
// crosses to the host and back (a byte's time 1 / bw + 2 / copy rate).
TEST(PlanCost, HostStagingAddsTheCopiesAndOverlapsNothing) {
  ClusterRates r;
  r.flops_per_s = 100e12;
  r.inter_bytes_per_s = 50e9;
  r.inter_latency_s = 0;
  r.host_copy_bytes_per_s = 10e9;
  r.ranks_per_node = 1;
  const double R = 124e6 * 4;
  StepWork w = work(8, 1024, false, R);
  w.overlap_dp = true;
  w.host_staged = true;
  w.bucket_bytes = 25e6;
  const StepCost c = estimate_step(gpt2(), layout(8, 1, 1, 1), {12}, w, r);
  EXPECT_EQ(c.dp_hidden, 0);
  EXPECT_NEAR(c.dp, 2.0 * 7 / 8 * R * (1 / 50e9 + 2 / 10e9), 1e-9);
}
