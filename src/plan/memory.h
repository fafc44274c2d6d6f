// The memory model: bytes per category that one rank will hold, predicted
// from the configuration before anything is allocated, and set beside what
// the tracked allocator measured at the end of the run.
//
// For a rank holding `shard` (its pipeline stage's layers, its tensor-
// parallel part), with n = parameters of its table, padded to np (a multiple
// of dp under ZeRO, so shards are equal: S = np / dp):
//   params      = np * 4
//   grads       = np * 4                   ZeRO 0, 1
//               = (S + Bk + E) * 4         ZeRO 2: the owned shard, a bucket (Bk)
//                                          of the largest block or of a block of
//                                          wte's rows (reduced as soon as made,
//                                          never whole), and wpe and ln_f (E),
//                                          reduced at step end
//   optimizer   = 2 n * 4                  ZeRO 0: AdamW m and v of everything
//               = 2 S * 4                  ZeRO 1, 2: of the owned shard only
//                 less the tied wte's elements on a last stage (pp > 1): the
//                 first stage alone keeps its moments (optimizer_range)
//   activations = GPT::activation_bytes(cfg, shard, options, micro_batch, seq_len)
//   comm        = slots * B * T * C * 4    pipeline stages > 0: gradients being sent back
//   workspace   = a block of rows of the largest split tensor (tp > 1:
//                 initialisation; at most GPT::kWeightBlockBytes, or one row)
//   other       = windows * 4              the shuffled order of one epoch
//
// Under LoRA (finetune.mode = lora) the table is the adapters' (n counts
// adapter elements only: the base has no gradients and no optimizer state),
// and:
//   params     += frozen vectors of the shard (biases, LayerNorm) * 4
//   quantized   = the whole quantized store on the rank that holds it (node
//                 rank 0 under quant.share = node; every rank under per_rank)
//   workspace   = max(the above, on a rank that quantizes (rank 0, or every
//                 rank under per_rank): a block of fp32 source rows and one
//                 tensor's nf4 absmax, StoreManifest::staging_bytes)
//   activations include the adapters' and dequantization scratch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "model/gpt_config.h"
#include "model/gpt.h"
#include "model/param_table.h"
#include "plan/rank_plan.h"

namespace meshlm {

// The ZeRO view of a rank's flat buffer: np padded elements, shard S each.
struct ZeroLayout {
  size_t n = 0, padded = 0, shard = 0;
};
ZeroLayout zero_layout(const GPTConfig& cfg, const RankPlan& r);
// The flat elements [first, second) whose AdamW moments the rank keeps: its
// ZeRO range ([0, n) under ZeRO 0; DP rank k's shard [k S, (k+1) S)), less
// the tied token embedding on a last stage that is not also the first. The
// first stage owns the tied embedding's optimizer state; the last one sends
// it its gradient and receives the updated weights (train/engine.cpp).
std::pair<size_t, size_t> optimizer_range(const std::vector<ParamSpec>& table, const RankPlan& r,
                                          const ZeroLayout& z);
// The flat elements [first, second) whose values the rank writes into a
// checkpoint (train/checkpoint.h): its ZeRO shard clipped to n under ZeRO 1
// and 2; under ZeRO 0 the same split of [0, n), [n k / dp, n (k+1) / dp).
std::pair<size_t, size_t> checkpoint_write_range(const RankPlan& r, const ZeroLayout& z);
// checkpoint.async's host snapshot: the values of the write range and the
// moments of its part that the rank keeps (optimizer_range), in floats.
size_t checkpoint_snapshot_numel(const GPTConfig& model, const RankPlan& r);
// Elements of the largest transformer block of the shard, and of the tensors
// outside the blocks other than the tied token embedding (wpe, ln_f) it holds.
size_t largest_block_numel(const std::vector<ParamSpec>& table);
size_t edge_numel(const std::vector<ParamSpec>& table);
// ZeRO 2: rows of the rank's part of the token embedding whose gradient is
// made and reduced at once (GPT::set_wte_grad_blocks; 0 where the table
// trains no wte), and the bucket that holds a block's gradients or those rows.
int zero2_wte_rows(const GPTConfig& model, const RankPlan& r, const std::vector<ParamSpec>& table);
size_t zero2_bucket_numel(const std::vector<ParamSpec>& table, int wte_rows);

// What is live at the peak of each phase of the run (core/alloc.h,
// MemPhase), per category:
//   start-up        other
//   base loading    + quantized, + workspace = the block of source rows
//                   being quantized and its tensor's nf4 absmax (LoRA only)
//   initialisation  + params, grads (ZeRO 0, 1), + workspace = a block of
//                   rows of the largest split tensor (tp > 1), or the training
//                   phase's set where that is larger (its buffers are made
//                   before training starts)
//   training        other, quantized, params, grads, optimizer,
//                   activations, comm (no workspace on the CPU)
// The process's peak is the largest phase total, not the sum of the
// categories' peaks (which fall in different phases).
struct PhasedMemory {
  // The moments that can be a phase's peak, in order: what is live then.
  struct Moment {
    MemPhase phase;
    MemoryByCategory live;
  };
  std::vector<Moment> moments;
  MemoryByCategory category_peaks() const;  // each category's largest over the moments
  size_t phase_total(MemPhase p) const;     // the largest total of p's moments (0: none)
  size_t peak() const;                      // the largest total
  const Moment* peak_moment() const;        // the last moment of that total (null: none)
  // Adds `bytes` of category `c` to every moment of phase `p`.
  void add(MemPhase p, MemCategory c, size_t bytes);
};
PhasedMemory predict_phases(const GPTConfig& model, const RankPlan& rank, uint64_t windows_per_epoch,
                            bool shuffle);
// Each category's peak over the run: predict_phases' category_peaks().
MemoryByCategory predict_memory(const GPTConfig& model, const RankPlan& rank,
                                uint64_t windows_per_epoch, bool shuffle);
// The whole model on one rank, no parallelism.
MemoryByCategory predict_memory(const GPTConfig& model, int micro_batch_size, int seq_len,
                                uint64_t windows_per_epoch, bool shuffle);

}  // namespace meshlm
