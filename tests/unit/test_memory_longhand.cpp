// The memory model (plan/memory.h) against the per-rank byte counts written
// out longhand, in the style of llm.c's fill_in_parameter_sizes and
// fill_in_activation_sizes: every parameter tensor of GPT-2 and every
// activation array of a transformer block listed one by one, for the local
// shapes of one rank, then summed into params, grads, optimizer state (AdamW
// m and v, per ZeRO stage), activations, comm, workspace and other.
//
// Nothing here asks the library how big anything is: no gpt_param_table,
// lora_param_table, GPT::activation_bytes, zero_layout, largest_block_numel,
// edge_numel or in_flight_micro_batches. What a rank holds (its layers, whether
// it is the first or last stage, the micro-batches it keeps in flight) is
// written down per case from the layout, worked by hand in the comments; the
// planner's plan_rank must agree with it, and predict_memory with the bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "model/gpt.h"
#include "model/gpt_config.h"
#include "model/lora.h"
#include "plan/memory.h"
#include "plan/parallel_config.h"
#include "plan/rank_plan.h"
#include "quant/qlinear.h"

using namespace meshlm;

namespace {

constexpr size_t kF = 4;  // bytes of an fp32 element

// Rows of a frozen matrix dequantized at a time (quant/qlinear.h).
constexpr size_t kTileRows = 64;
static_assert(quant::kQLinearTileRows == static_cast<int>(kTileRows),
              "the LoRA dequantization tile changed: update kTileRows");

// One rank of one layout, with what it holds worked out by hand.
struct Case {
  std::string name;
  GPTConfig model;
  int B = 1, T = 1;  // micro-batch, sequence length
  ParallelConfig par;
  FinetuneConfig ft;
  MeshCoords at;
  uint64_t windows = 0;
  bool shuffle = false;
  // By hand, from the layout:
  int layer_begin = 0, layers = 0;  // the blocks of this rank's stage
  bool first = true, last = true;   // pipeline stage 0 / pp - 1
  int slots = 1;                    // micro-batches of activations in flight
  bool pads = false;                // the flat buffer gets padding for ZeRO
  // LoRA on a frozen base: what the trainer adds to the plan where it knows
  // the mesh (the quantized store held here, the fp32 staging of a rank that
  // quantizes).
  size_t quantized_bytes = 0, staging_bytes = 0;
  // train.attention: flash keeps one log-sum-exp per row of a head.
  Attention attention = Attention::probabilities;
};

struct Expected {
  MemoryByCategory bytes{};
  size_t n = 0, padded = 0;  // trainable elements, and padded for ZeRO
};

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

Expected longhand(const Case& k) {
  const GPTConfig& g = k.model;
  const ParallelConfig& p = k.par;
  const size_t tp = p.tp;
  const size_t C = g.n_embd, NH = g.n_head, maxT = g.max_seq_len;
  const size_t Vp = (g.vocab_size + 63) / 64 * 64;  // padded to a multiple of 64
  // Local shapes under tensor parallelism (Megatron: heads, MLP columns and
  // vocabulary rows are split; LayerNorms and row-parallel biases are not).
  const size_t Cl = C / tp, Fl = 4 * C / tp, Vl = Vp / tp, NHl = NH / tp;
  const size_t B = k.B, T = k.T, BT = B * T;
  const size_t L = k.layers;
  const bool lora = k.ft.mode == FinetuneMode::lora;
  const bool ckpt = p.activation_checkpointing == Checkpointing::full;

  // ---- parameters: the tensors of GPT-2, one by one (this rank's part) -----
  const size_t wte = Vl * C;    // (Vp, C) vocabulary-parallel, tied lm_head
  const size_t wpe = maxT * C;  // (maxT, C)
  // One block:
  const size_t ln1w = C, ln1b = C;
  const size_t qkvw = 3 * Cl * C, qkvb = 3 * Cl;  // c_attn (3C, C), column-parallel
  const size_t attprojw = C * Cl, attprojb = C;   // attn c_proj (C, C), row-parallel
  const size_t ln2w = C, ln2b = C;
  const size_t fcw = Fl * C, fcb = Fl;            // c_fc (4C, C), column-parallel
  const size_t fcprojw = C * Fl, fcprojb = C;     // mlp c_proj (C, 4C), row-parallel
  const size_t lnfw = C, lnfb = C;
  const size_t block = ln1w + ln1b + qkvw + qkvb + attprojw + attprojb + ln2w + ln2b + fcw + fcb +
                       fcprojw + fcprojb;
  const size_t block_vectors = ln1w + ln1b + qkvb + attprojb + ln2w + ln2b + fcb + fcprojb;
  // Outside the blocks: wte on the first stage (embedding) and on the last
  // (tied lm_head), wpe on the first, ln_f on the last.
  const size_t edges = (k.first || k.last ? wte : 0) + (k.first ? wpe : 0) +
                       (k.last ? lnfw + lnfb : 0);

  // ---- LoRA adapters: A (r, IC), B (OC, r) per targeted matrix ------------
  // Column-parallel W (c_attn, c_fc): A whole, B split by rows like W.
  // Row-parallel W (both c_proj): A split by columns like W, B whole.
  const size_t r = k.ft.lora_rank;
  const LinearSlots tg = k.ft.lora_targets;
  const size_t qkvA = r * C, qkvB = 3 * Cl * r;        // W (3C, C)
  const size_t attoutA = r * Cl, attoutB = C * r;      // W (C, C)
  const size_t mlpupA = r * C, mlpupB = Fl * r;        // W (4C, C)
  const size_t mlpdownA = r * Fl, mlpdownB = C * r;    // W (C, 4C)
  const size_t block_adapters = (tg.has(LinearSlot::qkv) ? qkvA + qkvB : 0) +
                                (tg.has(LinearSlot::attn_out) ? attoutA + attoutB : 0) +
                                (tg.has(LinearSlot::mlp_up) ? mlpupA + mlpupB : 0) +
                                (tg.has(LinearSlot::mlp_down) ? mlpdownA + mlpdownB : 0);

  // What trains: every parameter, or the adapters (no adapters outside the blocks).
  const size_t trained_block = lora ? block_adapters : block;
  const size_t trained_edges = lora ? 0 : edges;
  const size_t n = L * trained_block + trained_edges;
  // The flat buffer, padded under ZeRO so that the dp shards are equal.
  const size_t pad = p.zero_stage > 0 ? p.dp : 1;
  const size_t np = round_up(n, pad);
  const size_t S = np / p.dp;
  // Under LoRA the frozen vectors (biases, LayerNorms) are copied per rank.
  const size_t frozen = lora ? L * block_vectors + (k.last ? lnfw + lnfb : 0) : 0;

  Expected e;
  e.n = n;
  e.padded = np;
  MemoryByCategory& m = e.bytes;
  at(m, MemCategory::params) = (np + frozen) * kF;
  // ZeRO 2 keeps the owned shard, a bucket for one block (all blocks are the
  // same size) or for a block of wte's rows, and wpe and ln_f. wte's rows go
  // as many at a time as the classifier's logits buffer (its chunk of rows,
  // below) holds for BT tokens.
  const bool has_wte = !lora && (k.first || k.last);
  // The classifier's chunk: BT rows cut into as few equal chunks as 2^25
  // floats of logits allow, at least one row, at most BT.
  const size_t most_rows = std::max<size_t>(1, (size_t(1) << 25) / Vl);
  size_t chunks = 1;
  while (chunks * most_rows < BT) ++chunks;
  size_t logits_rows = 1;
  while (logits_rows * chunks < BT) ++logits_rows;
  const size_t wte_rows = std::clamp<size_t>(logits_rows * Vl / BT, 1, Vl);
  const size_t bucket = std::max(L > 0 ? trained_block : 0, has_wte ? wte_rows * C : 0);
  at(m, MemCategory::grads) = p.zero_stage < 2
                                  ? np * kF
                                  : (S + bucket + trained_edges - (has_wte ? wte : 0)) * kF;
  // AdamW m and v: of everything (ZeRO 0) or of the owned shard; a last
  // stage that is not also the first keeps none of the tied wte's (the first
  // stage does), and wte leads its flat buffer.
  size_t opt_lo = p.zero_stage == 0 ? 0 : static_cast<size_t>(k.at.dp) * S;
  size_t opt_hi = p.zero_stage == 0 ? n : opt_lo + S;
  if (k.last && !k.first && !lora) {
    opt_lo = std::min(std::max(opt_lo, wte), opt_hi);  // none when wte covers the shard
  }
  at(m, MemCategory::optimizer) = 2 * (opt_hi - opt_lo) * kF;

  // ---- activations: the arrays of one block, one by one --------------------
  const size_t ln1 = BT * C, ln1_mean = BT, ln1_rstd = BT;
  const size_t qkv = BT * 3 * Cl;
  const size_t atty = BT * Cl;
  const bool flash = k.attention == Attention::flash;
  const size_t att = B * NHl * T * (flash ? 1 : T);  // (B, NHl, T, T), or (B, NHl, T)
  const size_t attproj = BT * C, res2 = BT * C;
  const size_t ln2 = BT * C, ln2_mean = BT, ln2_rstd = BT;
  const size_t fch = BT * Fl, fch_gelu = BT * Fl;
  const size_t fcproj = BT * C;
  const size_t res3 = BT * C;  // the block's output
  const size_t inner = ln1 + ln1_mean + ln1_rstd + qkv + atty + att + attproj + res2 + ln2 +
                       ln2_mean + ln2_rstd + fch + fch_gelu + fcproj;
  // One micro-batch: its token ids (first stage) and target ids (last
  // stage), 4 bytes each, the stage's input, its blocks (only their outputs
  // under full checkpointing), and on the last stage the head and the loss.
  const size_t ids = (k.first ? BT : 0) + (k.last ? BT : 0);
  const size_t input = BT * C;
  const size_t lnf = BT * C, lnf_mean = BT, lnf_rstd = BT;
  // The classifier's gradient of lnf (its backward may run in forward).
  const size_t dlnf = BT * C, losses = BT, xent_max = BT, xent_sums = 2 * BT;
  const size_t head = lnf + lnf_mean + lnf_rstd + dlnf + losses + xent_max + xent_sums;
  const size_t per_slot = ids + input + L * ((ckpt ? 0 : inner) + res3) + (k.last ? head : 0);
  // Checkpointing recomputes into one shared block.
  const size_t recompute = ckpt ? inner : 0;
  // Gradients of the activations, one set for the whole stage.
  const size_t dres = BT * C, dln = BT * C, dqkv = BT * 3 * Cl, datty = BT * Cl;
  const size_t datt = B * NHl * T * (flash ? 1 : T), dfch = BT * Fl, dfch_gelu = BT * Fl, dlosses = BT;
  // The classifier's logits, a chunk of rows at a time (above).
  const size_t logits = k.last ? logits_rows * Vl : 0;
  const size_t grad_acts = dres + dln + dqkv + datty + datt + dfch + dfch_gelu + dlosses + logits;
  // LoRA scratch: x A^T and its gradient, a replicated adapter's partial
  // gradient (r, C), a tile of dequantized rows, the positions (first stage).
  const size_t lora_u = BT * r, lora_du = BT * r, lora_tmp = r * C;
  const size_t qtile = kTileRows * std::max(C, Fl);
  const size_t wpe_rows = k.first ? T * C : 0;
  const size_t lora_scratch = lora ? lora_u + lora_du + lora_tmp + qtile + wpe_rows : 0;
  // The last stage keeps each micro-batch's mean loss until the step reads
  // them all: one float per micro-batch of the step.
  const size_t loss_means = k.last ? static_cast<size_t>(p.micro_batches) : 0;
  at(m, MemCategory::activations) =
      (k.slots * per_slot + recompute + grad_acts + lora_scratch + loss_means) * kF;

  // ---- the rest ----------------------------------------------------------
  at(m, MemCategory::quantized) = k.quantized_bytes;
  // Stages after the first send the gradient of their input back: one
  // (B, T, C) per micro-batch in flight.
  at(m, MemCategory::comm) = k.at.pp > 0 ? k.slots * BT * C * kF : 0;
  // Tensor parallelism initialises a split tensor whole, one at a time, 4
  // MiB of its rows at a time: the largest such block of a logical tensor
  // that is split.
  size_t whole = 0;
  if (tp > 1) {
    if (!lora) {
      whole = std::max({3 * C * C, C * C, 4 * C * C, C * 4 * C});  // c_attn, c_proj, c_fc, c_proj
      const size_t wte_block_rows = std::min(Vp, std::max<size_t>(1, (size_t(4) << 20) / kF / C));
      if (k.first || k.last) whole = std::max(whole, wte_block_rows * C);  // wte
    } else {
      if (tg.has(LinearSlot::qkv)) whole = std::max(whole, 3 * C * r);      // B (3C, r)
      if (tg.has(LinearSlot::attn_out)) whole = std::max(whole, r * C);     // A (r, C)
      if (tg.has(LinearSlot::mlp_up)) whole = std::max(whole, 4 * C * r);   // B (4C, r)
      if (tg.has(LinearSlot::mlp_down)) whole = std::max(whole, r * 4 * C); // A (r, 4C)
    }
  }
  at(m, MemCategory::workspace) = std::max(whole * kF, k.staging_bytes);
  // The shuffled order of one epoch's windows (uint32 each).
  at(m, MemCategory::other) = k.shuffle ? k.windows * 4 : 0;
  return e;
}

// ---- the models ------------------------------------------------------------

// C = 48 splits four ways; the vocabulary 101 pads to 128.
GPTConfig model_a() {
  return {.n_layer = 5, .n_head = 4, .n_embd = 48, .vocab_size = 101, .max_seq_len = 20};
}
// C = 30 (heads of 5): parameter counts that are not multiples of 4, so
// ZeRO pads. The whole model: 5 (12 C^2 + 13 C) + Vp C + maxT C + 2 C
// = 55950 + 3840 + 600 + 60 = 60450 = 2 mod 4.
GPTConfig model_b() {
  return {.n_layer = 5, .n_head = 6, .n_embd = 30, .vocab_size = 101, .max_seq_len = 20};
}
// A vocabulary (301 -> 320) larger than 4 C, so wte is the largest split
// tensor where a stage holds it.
GPTConfig model_w() {
  return {.n_layer = 4, .n_head = 6, .n_embd = 24, .vocab_size = 301, .max_seq_len = 17};
}

// A vocabulary of a million (a multiple of 64) for C = 8: 2^25 floats hold
// 33 rows of its logits, so 48 tokens go to the classifier in 2 chunks of
// 24 (not 33 and 15); under tp 2 (500,000 columns a rank) 67 rows, all 48
// at once.
GPTConfig model_v() {
  return {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 1000000, .max_seq_len = 16};
}

ParallelConfig layout(int dp, int tp, int pp, int zero, int m, PipelineSchedule s,
                      Checkpointing ck = Checkpointing::none, std::vector<int> stages = {}) {
  ParallelConfig p;
  p.dp = dp;
  p.tp = tp;
  p.pp = pp;
  p.zero_stage = zero;
  p.micro_batches = m;
  p.schedule = s;
  p.activation_checkpointing = ck;
  p.stage_layers.layers = std::move(stages);
  return p;
}

FinetuneConfig lora(int rank, std::vector<LinearSlot> targets) {
  FinetuneConfig f;
  f.mode = FinetuneMode::lora;
  f.lora_rank = rank;
  f.lora_targets = {};
  for (LinearSlot t : targets) f.lora_targets.add(t);
  return f;
}

constexpr auto kGPipe = PipelineSchedule::gpipe;
constexpr auto k1F1B = PipelineSchedule::one_f_one_b;
constexpr auto kFull = Checkpointing::full;
constexpr auto kNone = Checkpointing::none;

std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](Case c) { v.push_back(std::move(c)); };

  // ---- model A: C 48, NH 4, L 5, Vp 128, maxT 20; B 3, T 16 ----------------
  const GPTConfig A = model_a();
  add({.name = "A whole model, one rank", .model = A, .B = 3, .T = 16,
       .par = layout(1, 1, 1, 0, 1, k1F1B), .windows = 1000, .shuffle = true,
       .layer_begin = 0, .layers = 5});
  // GPipe keeps all m = 3 micro-batches even on one stage.
  add({.name = "A one rank, checkpointing full, gpipe m 3", .model = A, .B = 3, .T = 16,
       .par = layout(1, 1, 1, 0, 3, kGPipe, kFull), .windows = 77, .shuffle = false,
       .layer_begin = 0, .layers = 5, .slots = 3});
  add({.name = "A one rank, attention flash", .model = A, .B = 3, .T = 16,
       .par = layout(1, 1, 1, 0, 1, k1F1B), .windows = 1000, .shuffle = true,
       .layer_begin = 0, .layers = 5, .attention = Attention::flash});
  add({.name = "A tp 2, tp rank 1", .model = A, .B = 3, .T = 16,
       .par = layout(1, 2, 1, 0, 1, k1F1B), .at = {.tp = 1}, .windows = 513, .shuffle = true,
       .layer_begin = 0, .layers = 5});
  add({.name = "A tp 4, tp rank 3, checkpointing full", .model = A, .B = 3, .T = 16,
       .par = layout(1, 4, 1, 0, 1, k1F1B, kFull), .at = {.tp = 3}, .windows = 9, .shuffle = true,
       .layer_begin = 0, .layers = 5});
  // Balanced by hand (plan/partition.h, T = 16): layer = 3 (24 C^2 + 4 T C)
  // = 175104, embedding 3 C = 144, head 3 (2 C Vp) + 15 Vp = 38784.
  // pp 2: 3,2 costs max(525456, 388992); 2,3 costs 564096: 3,2.
  // 1F1B with m = 4: stage s keeps min(pp - s, m): 2 and 1.
  add({.name = "A pp 2 balanced, stage 0, 1f1b m 4", .model = A, .B = 3, .T = 16,
       .par = layout(1, 1, 2, 0, 4, k1F1B), .at = {.pp = 0}, .layer_begin = 0, .layers = 3,
       .first = true, .last = false, .slots = 2});
  add({.name = "A pp 2 balanced, stage 1, 1f1b m 4", .model = A, .B = 3, .T = 16,
       .par = layout(1, 1, 2, 0, 4, k1F1B), .at = {.pp = 1}, .layer_begin = 3, .layers = 2,
       .first = false, .last = true, .slots = 1});
  // pp 3: 2,2,1 costs max(350352, 350208, 213888) = 350352; every other
  // split has a stage of 3 layers or 2 layers with the head (>= 388992).
  // 1F1B with m = 5 keeps 3, 2, 1; checkpointing full.
  for (int s = 0; s < 3; ++s) {
    const int begin[] = {0, 2, 4}, layers[] = {2, 2, 1};
    add({.name = "A pp 3 balanced, checkpointing full, 1f1b m 5, stage " + std::to_string(s),
         .model = A, .B = 3, .T = 16, .par = layout(1, 1, 3, 0, 5, k1F1B, kFull),
         .at = {.pp = s}, .windows = 50, .shuffle = true, .layer_begin = begin[s],
         .layers = layers[s], .first = s == 0, .last = s == 2, .slots = 3 - s});
  }
  // Uneven stages as written, GPipe m 3: every stage keeps 3.
  for (int s = 0; s < 3; ++s) {
    const int begin[] = {0, 1, 4}, layers[] = {1, 3, 1};
    add({.name = "A pp 3 stages 1,3,1, gpipe m 3, stage " + std::to_string(s), .model = A,
         .B = 3, .T = 16, .par = layout(1, 1, 3, 0, 3, kGPipe, kNone, {1, 3, 1}), .at = {.pp = s},
         .layer_begin = begin[s], .layers = layers[s], .first = s == 0, .last = s == 2,
         .slots = 3});
  }
  add({.name = "A tp 2 x pp 2 stages 2,3, last stage, tp rank 0, gpipe m 2", .model = A, .B = 3,
       .T = 16, .par = layout(1, 2, 2, 0, 2, kGPipe, kNone, {2, 3}), .at = {.tp = 0, .pp = 1},
       .layer_begin = 2, .layers = 3, .first = false, .last = true, .slots = 2});
  add({.name = "A tp 4 x pp 2 stages 4,1, first stage, tp rank 2, 1f1b m 2", .model = A, .B = 3,
       .T = 16, .par = layout(1, 4, 2, 0, 2, k1F1B, kNone, {4, 1}), .at = {.tp = 2, .pp = 0},
       .layer_begin = 0, .layers = 4, .first = true, .last = false, .slots = 2});

  // ---- model B: C 30, NH 6, L 5, Vp 128, maxT 20; B 3, T 16 -----------------
  // ZeRO: n = 60450 is even (dp 2: no padding) and 2 mod 4 (dp 4: 60452).
  const GPTConfig Bm = model_b();
  for (int dp : {2, 4})
    for (int zero : {0, 1, 2})
      add({.name = "B dp " + std::to_string(dp) + " zero " + std::to_string(zero) + ", dp rank 1",
           .model = Bm, .B = 3, .T = 16, .par = layout(dp, 1, 1, zero, 1, k1F1B),
           .at = {.dp = 1}, .windows = 4321, .shuffle = true, .layer_begin = 0, .layers = 5,
           .pads = dp == 4 && zero > 0});
  // tp 2 (Cl 15): a block is 6 C + 3 Cl C + 3 Cl + C Cl + Fl C + Fl + C Fl
  // = 5685, odd. Stage 0 of 3,2: 3 blocks + wte 64 C + wpe 20 C = 19575
  // (odd: dp 2 pads by 1, dp 4 by 1). Stage 1: 2 blocks + wte + ln_f =
  // 11370 + 1920 + 60 = 13350 (even, 2 mod 4: dp 4 pads by 2).
  for (int dp : {2, 4})
    for (int zero : {0, 1, 2})
      for (int s = 0; s < 2; ++s) {
        const int begin[] = {0, 3}, layers[] = {3, 2};
        const bool pads = zero > 0 && (s == 0 || dp == 4);
        add({.name = "B dp " + std::to_string(dp) + " x tp 2 x pp 2 stages 3,2, zero " +
                     std::to_string(zero) + ", gpipe m 2, stage " + std::to_string(s) +
                     ", dp rank " + std::to_string(dp - 1) + ", tp rank 1",
             .model = Bm, .B = 3, .T = 16,
             .par = layout(dp, 2, 2, zero, 2, kGPipe, kNone, {3, 2}),
             .at = {.dp = dp - 1, .tp = 1, .pp = s}, .windows = 999, .shuffle = s == 1,
             .layer_begin = begin[s], .layers = layers[s], .first = s == 0, .last = s == 1,
             .slots = 2, .pads = pads});
      }
  add({.name = "B dp 4 zero 2, pp 3 stages 1,2,2, middle stage, checkpointing full, 1f1b m 3",
       .model = Bm, .B = 2, .T = 11, .par = layout(4, 1, 3, 2, 3, k1F1B, kFull, {1, 2, 2}),
       .at = {.dp = 2, .pp = 1}, .layer_begin = 1, .layers = 2, .first = false, .last = false,
       .slots = 2});

  // ---- model W: C 24, NH 6, L 4, Vp 320 (> 4 C), maxT 17; B 3, T 13 ---------
  // Under tp 2 the largest split tensor is wte (320 x 24) on the first and
  // last stages, c_fc / mlp c_proj (4 C x C) on the middle one.
  const GPTConfig W = model_w();
  for (int s = 0; s < 3; ++s) {
    const int begin[] = {0, 1, 3}, layers[] = {1, 2, 1};
    add({.name = "W tp 2 x pp 3 stages 1,2,1, 1f1b m 4, stage " + std::to_string(s), .model = W,
         .B = 3, .T = 13, .par = layout(1, 2, 3, 0, 4, k1F1B, kNone, {1, 2, 1}),
         .at = {.tp = 1, .pp = s}, .windows = 31, .shuffle = true, .layer_begin = begin[s],
         .layers = layers[s], .first = s == 0, .last = s == 2, .slots = 3 - s});
  }

  // ---- LoRA ------------------------------------------------------------------
  add({.name = "A lora r 4 all targets, one rank", .model = A, .B = 3, .T = 16,
       .par = layout(1, 1, 1, 0, 1, k1F1B),
       .ft = lora(4, {LinearSlot::qkv, LinearSlot::attn_out, LinearSlot::mlp_up,
                      LinearSlot::mlp_down}),
       .windows = 100, .shuffle = true, .layer_begin = 0, .layers = 5,
       .quantized_bytes = 123457, .staging_bytes = 128 * 48 * 4});
  // tp 2, r 3: qkv A 3 x 30 + B 45 x 3, mlp-down A 3 x 60 + B 30 x 3 per
  // block = 90 + 135 + 180 + 90 = 495; 2 blocks = 990 = 2 mod 4 (dp 4 pads).
  for (int zero : {0, 1, 2})
    add({.name = "B lora r 3 qkv,mlp-down, dp 4 x tp 2 x pp 2 stages 3,2, zero " +
                 std::to_string(zero) + ", last stage",
         .model = Bm, .B = 3, .T = 16, .par = layout(4, 2, 2, zero, 2, k1F1B, kNone, {3, 2}),
         .ft = lora(3, {LinearSlot::qkv, LinearSlot::mlp_down}), .at = {.dp = 3, .tp = 1, .pp = 1},
         .windows = 64, .shuffle = false, .layer_begin = 3, .layers = 2, .first = false,
         .last = true, .slots = 1, .pads = zero > 0});
  // tp 4 (Fl = C: the dequantization tile is 64 x C), first stage with the
  // dequantized positions; the rank neither holds the store nor quantizes.
  add({.name = "A lora r 5 attn-out,mlp-up, dp 2 zero 1 x tp 4 x pp 2 stages 2,3, first stage, "
               "checkpointing full, gpipe m 2",
       .model = A, .B = 3, .T = 16, .par = layout(2, 4, 2, 1, 2, kGPipe, kFull, {2, 3}),
       .ft = lora(5, {LinearSlot::attn_out, LinearSlot::mlp_up}), .at = {.dp = 0, .tp = 3, .pp = 0},
       .layer_begin = 0, .layers = 2, .first = true, .last = false, .slots = 2});
  add({.name = "A lora r 2 qkv, tp 2 x pp 2 stages 3,2, last stage, checkpointing full, "
               "attention flash",
       .model = A, .B = 3, .T = 16, .par = layout(1, 2, 2, 0, 2, k1F1B, kFull, {3, 2}),
       .ft = lora(2, {LinearSlot::qkv}), .at = {.tp = 1, .pp = 1}, .layer_begin = 3, .layers = 2,
       .first = false, .last = true, .slots = 1, .attention = Attention::flash});

  // ---- model V: the classifier in chunks ----------------------------------
  const GPTConfig V = model_v();
  add({.name = "V one rank, logits in 2 chunks of 24 rows", .model = V, .B = 3, .T = 16,
       .par = layout(1, 1, 1, 0, 1, k1F1B), .windows = 10, .shuffle = false, .layer_begin = 0,
       .layers = 2});
  add({.name = "V tp 2, tp rank 1, logits in one chunk", .model = V, .B = 3, .T = 16,
       .par = layout(1, 2, 1, 0, 1, k1F1B), .at = {.tp = 1}, .windows = 10, .shuffle = false,
       .layer_begin = 0, .layers = 2});
  add({.name = "V dp 2, ZeRO 2, wte's gradient in blocks of the chunk's size", .model = V, .B = 3,
       .T = 16, .par = layout(2, 1, 1, 2, 1, k1F1B), .at = {.dp = 1}, .windows = 10,
       .shuffle = false, .layer_begin = 0, .layers = 2});
  return v;
}

const char* const kCategoryNames[] = {"params",    "grads", "optimizer", "activations", "quantized",
                                      "comm",      "workspace", "checkpoint", "other"};
static_assert(std::size(kCategoryNames) == kNumMemCategories);

void check(const Case& k) {
  SCOPED_TRACE(k.name);
  // The cases are layouts the configuration accepts.
  ASSERT_NO_THROW(k.model.validate()) << k.name;
  ASSERT_NO_THROW(k.par.validate(k.model)) << k.name;
  ASSERT_NO_THROW(k.ft.validate()) << k.name;

  RankPlan r = plan_rank(k.model, k.par, k.ft, k.B, k.T, k.at, k.attention);
  r.quantized_bytes = k.quantized_bytes;
  r.base_staging_bytes = k.staging_bytes;
  // What the rank holds, as worked by hand.
  EXPECT_EQ(r.shard.layer_begin, k.layer_begin) << k.name << ": first layer";
  EXPECT_EQ(r.shard.layer_end, k.layer_begin + k.layers) << k.name << ": layer end";
  EXPECT_EQ(r.shard.first_stage, k.first) << k.name << ": first stage";
  EXPECT_EQ(r.shard.last_stage, k.last) << k.name << ": last stage";
  EXPECT_EQ(r.model.slots, k.slots) << k.name << ": micro-batches in flight";

  const Expected e = longhand(k);
  EXPECT_EQ(e.padded != e.n, k.pads) << k.name << ": the case should " << (k.pads ? "" : "not ")
                                     << "pad (n = " << e.n << ", padded " << e.padded << ")";
  const MemoryByCategory got = predict_memory(k.model, r, k.windows, k.shuffle);
  for (int c = 0; c < kNumMemCategories; ++c) {
    const auto cat = static_cast<MemCategory>(c);
    EXPECT_STREQ(mem_category_name(cat), kCategoryNames[c]);
    EXPECT_EQ(at(got, cat), at(e.bytes, cat)) << k.name << ": " << kCategoryNames[c] << " bytes";
  }
}

}  // namespace

TEST(MemoryLonghand, EveryCasePerCategory) {
  const std::vector<Case> all = cases();
  ASSERT_GE(all.size(), 40u);
  for (const Case& k : all) check(k);
}

// The overload for the whole model on one rank, and the sizes written as
// numbers: GPT-2 with C 48, L 5, Vp 128, maxT 20 has
//   5 (12 C^2 + 13 C) + Vp C + maxT C + 2 C = 141360 + 6144 + 960 + 96 = 148560
// parameters; activations for B 3, T 16 (BT 48, NH 4):
//   a block: 48 (18 C + 4) + B NH T T = 48 * 868 + 3 * 4 * 16 * 16 = 41664 + 3072 = 44736
//     (ln1, qkv 3C, atty, attproj, res2, ln2, fch 4C, fch_gelu 4C, fcproj, res3; two
//     means and two rstds per token; att),
//   a slot: token and target ids 2 * 48 + input 48 C + 5 blocks + head 48 (C + 2 + C + 1 + 1 + 2)
//     (lnf, its mean and rstd, dlnf, losses, row max, sums)
//     = 96 + 2304 + 223680 + 4896,
//   gradients: 48 (14 C + 1) + 3072 + one chunk of logits, all 48 rows: 48 Vp
//     = 35376 + 6144 = 41520,
//   the step's one micro-batch's mean loss: 1.
TEST(MemoryLonghand, WholeModelAsNumbers) {
  const GPTConfig A = model_a();
  const MemoryByCategory got = predict_memory(A, 3, 16, 1000, true);
  EXPECT_EQ(at(got, MemCategory::params), 148560u * 4);
  EXPECT_EQ(at(got, MemCategory::grads), 148560u * 4);
  EXPECT_EQ(at(got, MemCategory::optimizer), 2u * 148560u * 4);
  EXPECT_EQ(at(got, MemCategory::activations), (96u + 2304u + 223680u + 4896u + 41520u + 1u) * 4);
  EXPECT_EQ(at(got, MemCategory::quantized), 0u);
  EXPECT_EQ(at(got, MemCategory::comm), 0u);
  EXPECT_EQ(at(got, MemCategory::workspace), 0u);
  EXPECT_EQ(at(got, MemCategory::other), 4000u);

  Case k{.name = "A whole model, one-rank overload", .model = A, .B = 3, .T = 16,
         .par = layout(1, 1, 1, 0, 1, k1F1B), .windows = 1000, .shuffle = true,
         .layer_begin = 0, .layers = 5};
  const Expected e = longhand(k);
  for (int c = 0; c < kNumMemCategories; ++c) {
    const auto cat = static_cast<MemCategory>(c);
    EXPECT_EQ(at(got, cat), at(e.bytes, cat)) << k.name << ": " << kCategoryNames[c] << " bytes";
  }
}
