// The memory predictor: bytes per category and phase that one rank will
// hold, predicted before anything is allocated from what the model declares
// of itself (its parameter table, its activation layout, its step:
// model/step_declaration.h) and the run's options (RunMemoryOptions), and
// set beside what the tracked allocator measured at the end of the run.
// meshlm train, meshlm plan, the layout search and the tests all read it.
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

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "model/gpt_config.h"
#include "model/gpt.h"
#include "model/param_table.h"
#include "model/step_declaration.h"
#include "ops/precision.h"
#include "plan/rank_plan.h"
#include "quant/formats.h"

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
// ZeRO 0/1 under comm.overlap (train/zero.h): the layers' ranges of the flat
// gradient grouped from the shard's last layer down into buckets of at least
// `bucket_bytes` (the lowest may be smaller): each `layer` (the bucket's
// lowest, counted in the shard) and its elements [begin, end). The buckets
// are contiguous and in the order the backward finishes them.
struct GradBucket {
  int layer;
  size_t begin, end;
};
std::vector<GradBucket> grad_buckets(const std::vector<ParamSpec>& table, size_t bucket_bytes);
// The elements of one such block of rows (0 without wte).
size_t zero2_wte_block_numel(const GPTConfig& model, const RankPlan& r,
                             const std::vector<ParamSpec>& table);
// The flat range [a, b) of each block of `table`, from its first layer on.
std::vector<std::pair<size_t, size_t>> block_ranges(const std::vector<ParamSpec>& table);
// Calls part(k, lo, hi) for each DP rank k whose shard [k S, (k+1) S) meets
// the flat range [a, b), with the common part [lo, hi).
template <typename F>
void for_each_owner_part(size_t a, size_t b, size_t S, int dp, F part) {
  for (int k = 0; k < dp; ++k) {
    const size_t lo = std::max(a, k * S), hi = std::min(b, (k + 1) * S);
    if (lo < hi) part(k, lo, hi);
  }
}
// Calls block(r0, n, a, b) for each block of `rows` rows of the tied token
// embedding `p` (rows [r0, r0 + n), flat range [a, b)).
template <typename F>
void for_each_wte_block(const ParamSpec& p, int rows, F block) {
  const int64_t V = p.shape[0];
  const size_t C = static_cast<size_t>(p.shape[1]);
  for (int64_t r0 = 0; r0 < V; r0 += rows) {
    const int64_t n = std::min<int64_t>(rows, V - r0);
    block(static_cast<int>(r0), static_cast<int>(n), p.offset + r0 * C, p.offset + (r0 + n) * C);
  }
}
// The scratch of the ring reductions (comm/mpi_comm.h) with which ZeRO
// `stage` reduces the gradients of `table` (train/zero.h) on DP rank
// `dp_rank` of `dp`, under the process's bucket. (Under ZeRO 2 a
// reduction's scratch is on every rank of its chain but the first, so the
// ranks of a group differ.)
size_t zero_ring_scratch_bytes(int stage, const std::vector<ParamSpec>& table, const ZeroLayout& z,
                               int dp, int dp_rank, int wte_rows, size_t overlap_bytes = 0);

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

// ---- the run's prediction ----------------------------------------------------
//
// Which of a rank's groups move their buffers through host memory and MPI:
// on the CPU all of them; on a device backend those that comm.device stages
// through the host (comm.device = host, or auto where two ranks of the group
// share a GPU: train/group_paths.h); the others are NCCL's, whose buffers
// stay on the device and whose memory is its own (untracked, as MPI's).
struct HostGroups {
  bool dp = true, tp = true, pp = true, embedding = true, world = true;
  bool any() const { return dp || tp || pp || embedding || world; }
  static HostGroups none() { return {false, false, false, false, false}; }
};

// What a run decides beyond its rank's shape, as the prediction reads it
// (train/run_shape.h fills it from the run's options and its backend).
struct RunMemoryOptions {
  uint64_t windows = 0;           // training windows per epoch
  bool shuffle = false;           // data.shuffle: the epoch's order is kept
  bool checkpoint_async = false;  // the host snapshot of checkpoint.async
  bool cpu_gemm_warm_up = false;  // the CPU backend's start-up GEMM (ops::warm_up_gemm)
  // Threads whose GEMMs round their inputs on the CPU (train.precision bf16
  // or fp16 on the CPU's ops): their scratch in training (ops::RoundingScratch).
  int rounding_threads = 0;
  bool device = false;            // a GPU backend: the device's categories are added
  bool device_workspace = true;   // ... and its kernels' scratch (device_workspace_bytes)
  ops::Precision precision = ops::Precision::fp32;  // a GPU's GEMM inputs
  quant::QuantType quant_type = quant::QuantType::nf4;  // the frozen base's (LoRA)
  int pp = 1;                     // the mesh's pipeline stages
  // The groups whose buffers go through the host; on a device backend they
  // stage in pieces of at most staging_bytes (comm.bucket_mb).
  HostGroups host_groups;
  size_t staging_bytes = 0;
  // comm.overlap under ZeRO 0/1: the DP reduction's buckets (grad_buckets);
  // 0 = one reduction after the backward.
  size_t overlap_bytes = 0;
};

// A GPU backend's workspace for the step `step` declares (model/
// step_declaration.h), by ops/gpu_workspace.h's rules: the largest set of
// 16-bit copies any call makes (0 at fp32) plus the held copies, one buffer
// per depth of nesting as large as the largest span held there; the
// scratch of the sums over rows and of the embedding's index; the gradient
// norm's partial sums of the spans of trained tensors the rank counts; the
// upload staging.
size_t device_gemm_copies_bytes(const StepDeclaration& step, ops::Precision p);
size_t device_reduction_scratch_bytes(const StepDeclaration& step);
size_t device_norm_scratch_bytes(const std::vector<ParamSpec>& trained, const RankPlan& rank);
size_t device_workspace_bytes(const GPTConfig& model, const RankPlan& rank, ops::Precision p);

// The scratch of the ring reductions this rank will make (one per process,
// as large as the largest): of its gradient reductions over dp (as ZeRO
// makes them), its activations' over tp and the tied embedding's over pp,
// those of the groups in `through` (MPI's; NCCL reduces on the device).
size_t ring_scratch_prediction(const GPTConfig& model, const RankPlan& rank, int pp,
                               size_t overlap_bytes = 0, const HostGroups& through = {});
// Host staging of a device backend's groups (comm/staged_comm.h; a rank of
// `pp` stages): the staging buffer of each group of `staged`, as large as
// the largest piece of its collectives (pieces of at most `staging_bytes`),
// the pipeline's host buffers of activations where the pp group is staged
// (train/pipeline_runner.h; none on NCCL's links, comm/pipeline_links.h),
// and ZeRO 2's host buffer of the tied embedding's pieces where the world
// is (train/engine.cpp).
size_t staged_comm_bytes(const GPTConfig& model, const RankPlan& rank, int pp,
                         const HostGroups& staged, size_t staging_bytes, size_t overlap_bytes = 0);
// What is live at each phase of the run on the host: predict_phases, with
// the rings' scratch in training, checkpoint.async's snapshot and the CPU's
// start-up GEMM: what the run's memory table and the tests set beside the
// tracked allocator.
PhasedMemory predict_run_phases(const GPTConfig& model, const RankPlan& rank,
                                const RunMemoryOptions& o);
// The per-category prediction the run prints and writes to run.h5
// (memory/<category>/predicted_bytes): each category's peak over `phased`,
// and on a GPU the device's own (device_workspace_bytes, the NF4
// matrices), host and device added.
MemoryByCategory predicted_categories(const GPTConfig& model, const RankPlan& rank,
                                      const RunMemoryOptions& o, const PhasedMemory& phased);

}  // namespace meshlm
