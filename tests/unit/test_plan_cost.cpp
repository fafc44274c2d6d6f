// The planner's cost model (plan/cost.h) against the same arithmetic written
// out by hand for GPT-2 124M-sized layers, and the properties a ranking
// relies on: tp divides the compute, pp adds (pp - 1) slots of bubble,
// checkpointing adds a forward, groups within a node use its bandwidth.
#include <gtest/gtest.h>

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
  const StepCost c = estimate_step(m, layout(1, 1, 1, 2), {12}, 4, 1024, false, 0, r);
  // By hand: 6 x 12 C^2 x 12 layers x tokens + 12 x 12 x B T^2 C + 6 V C tokens,
  // V padded to 50304, per micro-batch of 4 x 1024 tokens, 2 micro-batches.
  const double C = 768, tokens = 4096, V = 50304;
  const double flops = 6 * 12 * C * C * 12 * tokens + 12.0 * 12 * 4 * 1024.0 * 1024 * C + 6 * V * C * tokens;
  EXPECT_NEAR(c.compute, 2 * flops / 1e12, 1e-9);
  EXPECT_EQ(c.pipeline_bubble, 0);
  EXPECT_EQ(c.tp, 0);
  EXPECT_EQ(c.pp, 0);
  EXPECT_EQ(c.dp, 0);
  // LoRA: 4 FLOPs per parameter and token instead of 6 (no weight gradient).
  const StepCost lora = estimate_step(m, layout(1, 1, 1, 2), {12}, 4, 1024, true, 0, r);
  const double lflops = 4 * 12 * C * C * 12 * tokens + 12.0 * 12 * 4 * 1024.0 * 1024 * C + 4 * V * C * tokens;
  EXPECT_NEAR(lora.compute, 2 * lflops / 1e12, 1e-9);
}

TEST(PlanCost, SmallMicroBatchesRunAtTheirRowsEfficiency) {
  ClusterRates r;
  r.flops_per_s = 1e12;
  r.efficiency_by_rows = {{1024, 0.5}, {4096, 1.0}};
  EXPECT_DOUBLE_EQ(gemm_efficiency(r, 512), 0.5);    // below the table: its first
  EXPECT_DOUBLE_EQ(gemm_efficiency(r, 8192), 1.0);   // above: its last
  EXPECT_NEAR(gemm_efficiency(r, 2048), 0.75, 1e-12);  // halfway in log(rows)
  EXPECT_DOUBLE_EQ(gemm_efficiency(ClusterRates{}, 7), 1.0);
  // B = 2 x T = 1024 rows at 0.75 of the rate: the same FLOPs take 4/3 as long
  // as without the table.
  const GPTConfig m = gpt2();
  ClusterRates flat = r;
  flat.efficiency_by_rows.clear();
  const StepCost slow = estimate_step(m, layout(1, 1, 1, 4), {12}, 2, 1024, false, 0, r);
  const StepCost fast = estimate_step(m, layout(1, 1, 1, 4), {12}, 2, 1024, false, 0, flat);
  EXPECT_NEAR(slow.compute, fast.compute / 0.75, 1e-12 * fast.compute);
}

TEST(PlanCost, ParallelismDividesComputeAndAddsItsCosts) {
  ClusterRates r;
  r.ranks_per_node = 8;
  const GPTConfig m = gpt2();
  const StepCost one = estimate_step(m, layout(1, 1, 1, 8), {12}, 2, 1024, false, 0, r);
  const StepCost tp2 = estimate_step(m, layout(1, 2, 1, 8), {12}, 2, 1024, false, 0, r);
  EXPECT_NEAR(tp2.compute, one.compute / 2, 1e-12);
  EXPECT_GT(tp2.tp, 0);
  // 4 all-reduces per layer and micro-batch: ring 2 (tp-1)/tp of B T C floats.
  const double bytes = 2.0 * 1024 * 768 * 4;
  EXPECT_NEAR(tp2.tp, 8 * 4 * 12 * (bytes / r.intra_bytes_per_s + 2 * r.intra_latency_s), 1e-12);
  // pp 2 of 6 + 6 layers: the slowest stage holds the classifier; a bubble
  // of one slot.
  const StepCost pp2 = estimate_step(m, layout(1, 1, 2, 8), {6, 6}, 2, 1024, false, 0, r);
  EXPECT_NEAR(pp2.pipeline_bubble, pp2.compute / 8, 1e-12);
  EXPECT_LT(pp2.compute, one.compute);
  EXPECT_GT(pp2.pp, 0);
  // Checkpointing recomputes the blocks' forward.
  ParallelConfig ck = layout(1, 1, 1, 8);
  ck.activation_checkpointing = Checkpointing::full;
  EXPECT_GT(estimate_step(m, ck, {12}, 2, 1024, false, 0, r).compute, one.compute);
  // dp: the gradients' ring all-reduce.
  const StepCost dp4 = estimate_step(m, layout(4, 1, 1, 2), {12}, 2, 1024, false, 1e9, r);
  EXPECT_NEAR(dp4.dp, 2.0 * 3 / 4 * 1e9 / r.intra_bytes_per_s + 6 * r.intra_latency_s, 1e-12);
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
  const StepCost across = estimate_step(m, layout(4, 1, 1, 1), {12}, 1, 1024, false, 1e9, r);
  r.ranks_per_node = 4;
  const StepCost within = estimate_step(m, layout(4, 1, 1, 1), {12}, 1, 1024, false, 1e9, r);
  EXPECT_GT(across.dp, 50 * within.dp);
}
