#include "plan/memory.h"

#include <algorithm>

#include <climits>

#include "comm/mpi_comm.h"
#include "comm/staged_comm.h"
#include "core/error.h"
#include "model/gpt.h"
#include "ops/blas.h"
#include "ops/gpu_workspace.h"
#include "ops/ops.h"

namespace meshlm {

namespace {

ZeroLayout zero_layout_of(const std::vector<ParamSpec>& trained, const RankPlan& r) {
  ZeroLayout z;
  z.n = table_numel(trained);
  const size_t pad = r.model.pad_multiple;
  z.padded = (z.n + pad - 1) / pad * pad;
  z.shard = z.padded / static_cast<size_t>(r.dp);
  return z;
}

}  // namespace

ZeroLayout zero_layout(const GPTConfig& cfg, const RankPlan& r) {
  return zero_layout_of(*shared_trainable_table(cfg, r.shard, r.model), r);
}

std::pair<size_t, size_t> optimizer_range(const std::vector<ParamSpec>& table, const RankPlan& r,
                                          const ZeroLayout& z) {
  size_t begin = 0, end = z.n;
  if (r.zero_stage > 0) {
    begin = static_cast<size_t>(r.dp_rank) * z.shard;
    end = begin + z.shard;
  }
  if (r.shard.last_stage && !r.shard.first_stage) {
    for (const ParamSpec& p : table) {
      if (p.tied != TiedGroup::embedding) continue;
      // The last stage's table starts with the tied lm_head.
      MESHLM_CHECK(p.offset == 0, "the tied embedding leads the last stage's table");
      begin = std::min(std::max(begin, p.numel()), end);  // empty when wte covers the range
    }
  }
  return {begin, end};
}

std::pair<size_t, size_t> checkpoint_write_range(const RankPlan& r, const ZeroLayout& z) {
  const size_t k = static_cast<size_t>(r.dp_rank), dp = static_cast<size_t>(r.dp);
  if (r.zero_stage > 0) return {std::min(k * z.shard, z.n), std::min((k + 1) * z.shard, z.n)};
  return {z.n * k / dp, z.n * (k + 1) / dp};
}

size_t checkpoint_snapshot_numel(const GPTConfig& model, const RankPlan& r) {
  const ZeroLayout z = zero_layout(model, r);
  const auto [w0, w1] = checkpoint_write_range(r, z);
  const auto [m0, m1] = optimizer_range(*shared_trainable_table(model, r.shard, r.model), r, z);
  const size_t lo = std::max(w0, m0), hi = std::min(w1, std::min(m1, z.n));
  return (w1 - w0) + (hi > lo ? 2 * (hi - lo) : 0);
}

size_t largest_block_numel(const std::vector<ParamSpec>& table) {
  std::vector<size_t> per_layer;
  int last = -2;
  for (const ParamSpec& p : table) {
    if (p.layer < 0) continue;
    if (p.layer != last) per_layer.push_back(0);
    last = p.layer;
    per_layer.back() += p.numel();
  }
  return per_layer.empty() ? 0 : *std::max_element(per_layer.begin(), per_layer.end());
}

size_t edge_numel(const std::vector<ParamSpec>& table) {
  size_t n = 0;
  for (const ParamSpec& p : table)
    if (p.layer < 0 && p.tied != TiedGroup::embedding) n += p.numel();
  return n;
}

int zero2_wte_rows(const GPTConfig& model, const RankPlan& r, const std::vector<ParamSpec>& table) {
  if (!find_role(table, ParamRole::token_embedding)) return 0;
  return wte_grad_rows(model, r.shard, r.model,
                       static_cast<size_t>(r.micro_batch) * static_cast<size_t>(r.seq_len));
}

std::vector<GradBucket> grad_buckets(const std::vector<ParamSpec>& table, size_t bucket_bytes) {
  const std::vector<std::pair<size_t, size_t>> ranges = block_ranges(table);
  const int L = static_cast<int>(ranges.size());
  // Layers one after the other, each holding gradients; else no buckets
  // (the reduction after the backward).
  for (int l = 0; l < L; ++l)
    if (ranges[l].second <= ranges[l].first || (l + 1 < L && ranges[l].second != ranges[l + 1].first))
      return {};
  std::vector<GradBucket> out;
  size_t end = 0;
  bool open = false;
  for (int l = L - 1; l >= 0; --l) {
    if (!open) end = ranges[l].second;
    open = true;
    const size_t begin = ranges[l].first;
    if ((end - begin) * sizeof(float) >= bucket_bytes || l == 0) {
      out.push_back({l, begin, end});
      open = false;
    }
  }
  return out;
}

size_t zero2_wte_block_numel(const GPTConfig& model, const RankPlan& r,
                             const std::vector<ParamSpec>& table) {
  const ParamSpec* wte = find_role(table, ParamRole::token_embedding);
  return wte ? static_cast<size_t>(zero2_wte_rows(model, r, table)) * wte->shape[1] : 0;
}

size_t zero2_bucket_numel(const std::vector<ParamSpec>& table, int wte_rows) {
  const ParamSpec* wte = find_role(table, ParamRole::token_embedding);
  const size_t wte_block = wte ? static_cast<size_t>(wte_rows) * wte->shape[1] : 0;
  return std::max(largest_block_numel(table), wte_block);
}

std::vector<std::pair<size_t, size_t>> block_ranges(const std::vector<ParamSpec>& table) {
  std::vector<std::pair<size_t, size_t>> ranges;
  int layer0 = INT_MAX;
  for (const ParamSpec& p : table)
    if (p.layer >= 0) layer0 = std::min(layer0, p.layer);
  for (const ParamSpec& p : table) {
    if (p.layer < 0) continue;
    const size_t l = p.layer - layer0;
    if (ranges.size() <= l) ranges.resize(l + 1, {p.offset, p.offset});
    ranges[l].second = p.offset + p.numel();
  }
  return ranges;
}

namespace {

// The reductions over dp ZeRO makes of one step's gradients (train/zero.h),
// each as f(kind, count, owner) with `count` as the Communicator call takes
// it (owner: a reduce's root): ZeRO 0 one all-reduce, ZeRO 1 one
// reduce-scatter, ZeRO 2 a reduce to each owner's part of every layer, block
// of wte's rows and other tensor; under comm.overlap (`overlap_bytes`, ZeRO
// 0/1) the same per bucket of layers and for the tensors before and after
// them.
template <typename F>
void for_each_dp_reduction(int stage, const std::vector<ParamSpec>& table, const ZeroLayout& z,
                           int dp, int wte_rows, size_t overlap_bytes, F f) {
  using comm::Reduction;
  auto reduce = [&](int owner, size_t lo, size_t hi) { f(Reduction::reduce, hi - lo, owner); };
  if (stage < 2 && overlap_bytes > 0 && dp > 1) {
    if (const std::vector<GradBucket> buckets = grad_buckets(table, overlap_bytes); !buckets.empty()) {
      auto part = [&](size_t a, size_t b) {
        if (a >= b) return;
        if (stage == 0)
          f(Reduction::all_reduce, b - a, 0);
        else
          for_each_owner_part(a, b, z.shard, dp, reduce);
      };
      for (const GradBucket& b : buckets) part(b.begin, b.end);
      part(0, buckets.back().begin);
      part(buckets.front().end, z.n);
      return;
    }
  }
  if (stage == 0) return f(Reduction::all_reduce, z.n, 0);
  if (stage == 1) return f(Reduction::reduce_scatter, z.shard, 0);
  for (const auto& [a, b] : block_ranges(table)) for_each_owner_part(a, b, z.shard, dp, reduce);
  for (const ParamSpec& p : table) {
    if (p.layer >= 0) continue;
    if (p.tied == TiedGroup::embedding)
      for_each_wte_block(p, wte_rows, [&](int, int, size_t a, size_t b) {
        for_each_owner_part(a, b, z.shard, dp, reduce);
      });
    else
      for_each_owner_part(p.offset, p.offset + p.numel(), z.shard, dp, reduce);
  }
}

}  // namespace

size_t zero_ring_scratch_bytes(int stage, const std::vector<ParamSpec>& table, const ZeroLayout& z,
                               int dp, int dp_rank, int wte_rows, size_t overlap_bytes) {
  using comm::Reduction;
  size_t most = 0;
  for_each_dp_reduction(stage, table, z, dp, wte_rows, overlap_bytes,
                        [&](Reduction kind, size_t count, int owner) {
                          most = std::max(most, kind == Reduction::reduce
                                                    ? comm::ring_scratch_bytes_of(
                                                          kind, count, DType::f32, dp, dp_rank, owner)
                                                    : comm::ring_scratch_bytes_of(kind, count,
                                                                                  DType::f32, dp));
                        });
  return most;
}

PhasedMemory predict_phases(const GPTConfig& model, const RankPlan& r, uint64_t windows_per_epoch,
                            bool shuffle) {
  const auto table_kept = shared_trainable_table(model, r.shard, r.model);
  const std::vector<ParamSpec>& table = *table_kept;
  const ZeroLayout z = zero_layout(model, r);
  constexpr size_t f = sizeof(float);
  // What lives from its phase to the end of the run.
  MemoryByCategory kept{};
  at(kept, MemCategory::other) = shuffle ? windows_per_epoch * sizeof(uint32_t) : 0;
  PhasedMemory out;
  out.moments.push_back({MemPhase::startup, kept});
  if (r.model.lora.enabled) {
    // The quantized store (on the rank that holds it), beside the block of
    // full-precision source rows of a rank that quantizes.
    at(kept, MemCategory::quantized) = r.quantized_bytes;
    MemoryByCategory loading = kept;
    at(loading, MemCategory::workspace) = r.base_staging_bytes;
    out.moments.push_back({MemPhase::base_loading, loading});
  }
  // The model's parameters and gradients, and at first the whole of each
  // split tensor while it is initialised (tp > 1).
  at(kept, MemCategory::params) = z.padded * f;
  if (r.model.lora.enabled) at(kept, MemCategory::params) += GPT::frozen_numel(model, r.shard) * f;
  if (r.zero_stage < 2) at(kept, MemCategory::grads) = z.padded * f;
  MemoryByCategory init = kept;
  at(init, MemCategory::workspace) = GPT::weight_block_bytes(table, r.shard.tp_size, /*host=*/true);
  // Then activations, ZeRO 2's gradient shard, bucket and edge tensors,
  // AdamW's moments and the pipeline's buffers, kept through training.
  at(kept, MemCategory::activations) =
      GPT::activation_bytes(model, r.shard, r.model, r.micro_batch, r.seq_len);
  if (r.zero_stage == 2)
    at(kept, MemCategory::grads) = (z.shard + zero2_bucket_numel(table, zero2_wte_rows(model, r, table)) +
                                     edge_numel(table)) * f;
  const auto [opt_begin, opt_end] = optimizer_range(table, r, z);
  at(kept, MemCategory::optimizer) = 2 * (opt_end - opt_begin) * f;
  if (r.pipeline_stage > 0)
    at(kept, MemCategory::comm) = static_cast<size_t>(r.model.slots) * r.micro_batch * r.seq_len *
                                  model.n_embd * f;
  out.moments.push_back({MemPhase::initialisation, init});
  out.moments.push_back({MemPhase::initialisation, kept});
  out.moments.push_back({MemPhase::training, kept});
  return out;
}

MemoryByCategory PhasedMemory::category_peaks() const {
  MemoryByCategory m{};
  for (const Moment& t : moments)
    for (int c = 0; c < kNumMemCategories; ++c) m[c] = std::max(m[c], t.live[c]);
  return m;
}

size_t PhasedMemory::phase_total(MemPhase p) const {
  size_t most = 0;
  for (const Moment& t : moments)
    if (t.phase == p) most = std::max(most, total(t.live));
  return most;
}

const PhasedMemory::Moment* PhasedMemory::peak_moment() const {
  const Moment* top = nullptr;
  for (const Moment& t : moments)
    if (!top || total(t.live) >= total(top->live)) top = &t;
  return top;
}

size_t PhasedMemory::peak() const {
  const Moment* top = peak_moment();
  return top ? total(top->live) : 0;
}

void PhasedMemory::add(MemPhase p, MemCategory c, size_t bytes) {
  for (Moment& t : moments)
    if (t.phase == p) at(t.live, c) += bytes;
}

MemoryByCategory predict_memory(const GPTConfig& model, const RankPlan& r,
                                uint64_t windows_per_epoch, bool shuffle) {
  return predict_phases(model, r, windows_per_epoch, shuffle).category_peaks();
}

MemoryByCategory predict_memory(const GPTConfig& model, int micro_batch_size, int seq_len,
                                uint64_t windows_per_epoch, bool shuffle) {
  RankPlan r;
  r.micro_batch = micro_batch_size;
  r.seq_len = seq_len;
  return predict_memory(model, r, windows_per_epoch, shuffle);
}

// ---- the run's prediction ----------------------------------------------------

size_t device_gemm_copies_bytes(const StepDeclaration& step, ops::Precision p) {
  if (p == ops::Precision::fp32) return 0;
  size_t most = 0;
  for (const DeclaredGemm& g : step.gemms) {
    const auto [a, b] =
        ops::gemm_input_spans(g.ta, g.tb, g.M, g.N, g.K, g.lda, g.ldb, g.sa, g.sb, g.batch);
    most = std::max(most, ops::gemm_16bit_copies_bytes(g.a_held ? 0 : a, g.b_held ? 0 : b));
  }
  for (const DeclaredRounding& r : step.roundings)
    most = std::max(most, ops::gemm_16bit_copies_bytes(r.a, r.b, r.c));
  std::vector<size_t> held;  // per depth, the largest span held there
  for (const DeclaredHold& h : step.holds) {
    if (held.size() <= size_t(h.depth)) held.resize(h.depth + 1, 0);
    held[h.depth] = std::max(held[h.depth], 2 * h.elements);
  }
  for (size_t b : held) most += b;
  return most;
}

size_t device_reduction_scratch_bytes(const StepDeclaration& step) {
  size_t partials = 0;
  for (const DeclaredRowSum& r : step.row_sums)
    partials = std::max(partials, ops::column_partials_bytes(r.rows, r.columns));
  return partials + (step.embedding_rows > 0 ? ops::embedding_index_bytes(step.embedding_rows) : 0);
}

size_t device_norm_scratch_bytes(const std::vector<ParamSpec>& trained, const RankPlan& r) {
  // Kernels::sums_of_squares on a GPU (cuda/kernels_cuda.cu) over the spans
  // the gradient norm counts (Zero::sum_of_squares, Engine::global_grad_norm):
  // each tensor's part in the rank's owned range, replicated tensors on TP
  // rank 0 only, tied ones on the first stage only, none on a DP rank other
  // than 0 under ZeRO 0; one double per span and one per block of
  // kSumOfSquaresBlock elements of it, none at all without a span.
  if (r.zero_stage == 0 && r.dp_rank != 0) return 0;
  const ZeroLayout z = zero_layout_of(trained, r);
  const size_t own_begin = r.zero_stage == 0 ? 0 : static_cast<size_t>(r.dp_rank) * z.shard;
  const size_t own_end = r.zero_stage == 0 ? z.n : own_begin + z.shard;
  size_t doubles = 0;
  for (const ParamSpec& p : trained) {
    if (!counted_in_grad_norm(p, r.shard.tp_rank, r.shard.first_stage)) continue;
    const size_t lo = std::max(p.offset, own_begin), hi = std::min(p.offset + p.numel(), own_end);
    if (lo < hi) doubles += 1 + (hi - lo + ops::kSumOfSquaresBlock - 1) / ops::kSumOfSquaresBlock;
  }
  return doubles * sizeof(double);
}

size_t device_workspace_bytes(const GPTConfig& model, const RankPlan& r, ops::Precision p) {
  const StepDeclaration step = declare_step(model, r.shard, r.model, r.micro_batch, r.seq_len);
  return device_gemm_copies_bytes(step, p) + device_reduction_scratch_bytes(step) +
         device_norm_scratch_bytes(*shared_trainable_table(model, r.shard, r.model), r) +
         ops::kUploadStagingBytes;
}

namespace {

// The most elements one all-reduce over tp sums: the activations in and out
// of each tensor-parallel region, the LoRA adapters' partial gradients, the
// classifier's row statistics.
size_t tp_reduction_count(const GPTConfig& model, const RankPlan& r,
                          const std::vector<ParamSpec>& table) {
  const size_t N = static_cast<size_t>(r.micro_batch) * r.seq_len;
  size_t tp_count = std::max(N * model.n_embd, 2 * N);
  // (Of the parameters only a LoRA factor that every TP rank holds whole
  // gets a partial gradient summed over tp: model/gpt_linear.cpp.)
  for (const ParamSpec& p : table)
    if ((p.role == ParamRole::lora_a || p.role == ParamRole::lora_b) && p.tp_dim < 0)
      tp_count = std::max(tp_count, p.numel());
  return tp_count;
}

}  // namespace

size_t staged_comm_bytes(const GPTConfig& model, const RankPlan& r, int pp, const HostGroups& staged,
                         size_t staging_bytes, size_t overlap_bytes) {
  const auto table_kept = shared_trainable_table(model, r.shard, r.model);
  const std::vector<ParamSpec>& table = *table_kept;
  const size_t f = sizeof(float);
  // The stage of a staged collective of `count` floats whose pieces hold
  // `parts` ranks' side by side, on a group of `ranks`.
  auto stage = [&](size_t count, int parts, int ranks) {
    return std::min(comm::staged_piece_elements(f, parts, ranks, staging_bytes), count) * f *
           size_t(parts);
  };
  size_t bytes = 0;
  // DP: ZeRO's reductions of the gradients and the all-gather of the
  // updated shards.
  if (staged.dp && r.dp > 1) {
    // The all-gather of the updated shards (ZeRO 1 and 2), then ZeRO's
    // reductions, each in its own pieces.
    const ZeroLayout z = zero_layout(model, r);
    size_t dp = r.zero_stage >= 1 ? stage(z.shard, r.dp, r.dp) : 0;
    for_each_dp_reduction(r.zero_stage, table, z, r.dp,
                          zero2_wte_rows(model, r, table), overlap_bytes,
                          [&](comm::Reduction kind, size_t count, int) {
                            const int parts = kind == comm::Reduction::reduce_scatter ? r.dp : 1;
                            dp = std::max(dp, stage(count, parts, r.dp));
                          });
    bytes += dp;
  }
  // TP: the all-reduces inside the layers.
  if (staged.tp && r.shard.tp_size > 1)
    bytes += stage(tp_reduction_count(model, r, table), 1, r.shard.tp_size);
  if (pp > 1) {
    // PP: each slot's activations sent forward (not from the last stage),
    // and the message received last, in host buffers of the pipeline's.
    if (staged.pp) {
      const size_t act = static_cast<size_t>(r.micro_batch) * r.seq_len * model.n_embd * f;
      if (!r.shard.last_stage) bytes += static_cast<size_t>(r.model.slots) * act;
      bytes += act;
    }
    // The embedding group of the first and last stage: the tied tensors'
    // gradients summed (below ZeRO 2) and their values shared.
    if (r.shard.first_stage || r.shard.last_stage)
      for (const ParamSpec& p : table) {
        if (p.tied != TiedGroup::embedding) continue;
        if (staged.embedding) bytes += stage(p.numel(), 1, 2);
        // ZeRO 2 sums them piece by piece through a host buffer of one
        // block of wte's rows (train/engine.cpp), where the world's buffers
        // go through the host.
        if (staged.world && r.zero_stage == 2 && p.role == ParamRole::token_embedding)
          bytes += zero2_wte_block_numel(model, r, table) * f;
      }
  }
  return bytes;
}

size_t ring_scratch_prediction(const GPTConfig& model, const RankPlan& r, int pp,
                               size_t overlap_bytes, const HostGroups& through) {
  using comm::Reduction;
  const auto table_kept = shared_trainable_table(model, r.shard, r.model);
  const std::vector<ParamSpec>& table = *table_kept;
  size_t most = 0;
  // Gradients over dp, as ZeRO reduces them.
  if (through.dp)
    most = zero_ring_scratch_bytes(r.zero_stage, table, zero_layout(model, r), r.dp, r.dp_rank,
                                   zero2_wte_rows(model, r, table), overlap_bytes);
  // Over tp: what tp_reduction_count says.
  const int tp = r.shard.tp_size;
  if (through.tp)
    most = std::max(most, comm::ring_scratch_bytes_of(Reduction::all_reduce,
                                                      tp_reduction_count(model, r, table),
                                                      DType::f32, tp));
  // Over pp: the tied embedding's gradient, from the last stage to the first
  // (the root; the last stage starts the chain and needs no scratch).
  // (ZeRO 2 sends it in pieces through its bucket instead).
  if (through.embedding && pp > 1 && r.shard.first_stage && r.zero_stage < 2)
    for (const ParamSpec& p : table)
      if (p.tied != TiedGroup::none)
        most = std::max(most,
                        comm::ring_scratch_bytes_of(Reduction::reduce, p.numel(), DType::f32, 2));
  return most;
}

PhasedMemory predict_run_phases(const GPTConfig& model, const RankPlan& r,
                                const RunMemoryOptions& o) {
  PhasedMemory phased = predict_phases(model, r, o.windows, o.shuffle);
  // The rings' scratch: MPI's reductions of host buffers, the CPU's and a
  // device's staged through the host. A device's groups under NCCL reduce
  // on the device (their scalars are below the rings' threshold).
  if (!o.device || o.host_groups.any())
    phased.add(MemPhase::training, MemCategory::comm,
               ring_scratch_prediction(model, r, o.pp, o.overlap_bytes,
                                       o.device ? o.host_groups : HostGroups{}));
  if (o.device)
    phased.add(MemPhase::training, MemCategory::comm,
               staged_comm_bytes(model, r, o.pp, o.host_groups, o.staging_bytes, o.overlap_bytes));
  // checkpoint.async: the host snapshot, made with the checkpointer after
  // the training buffers (the last moment of initialisation) and kept.
  if (o.checkpoint_async) {
    const size_t snapshot = checkpoint_snapshot_numel(model, r) * sizeof(float);
    PhasedMemory::Moment* made = nullptr;
    for (PhasedMemory::Moment& m : phased.moments)
      if (m.phase == MemPhase::initialisation) made = &m;
    if (made) at(made->live, MemCategory::checkpoint) += snapshot;
    phased.add(MemPhase::training, MemCategory::checkpoint, snapshot);
  }
  // On the CPU the start-up's GEMM that makes OpenBLAS's buffer resident.
  if (o.cpu_gemm_warm_up)
    phased.add(MemPhase::startup, MemCategory::workspace, ops::kGemmWarmUpFloats * sizeof(float));
  // The rounded GEMMs' tiles (bf16 / fp16 on the CPU's ops), made as
  // training begins.
  phased.add(MemPhase::training, MemCategory::workspace,
             ops::rounding_scratch_bytes(o.rounding_threads));
  return phased;
}

MemoryByCategory predicted_categories(const GPTConfig& model, const RankPlan& r,
                                      const RunMemoryOptions& o, const PhasedMemory& phased) {
  MemoryByCategory predicted = phased.category_peaks();
  if (!o.device) return predicted;
  // On a GPU each trained tensor is made on the host a block of rows at a
  // time and uploaded (GPT::set_weights): host workspace of one block.
  const auto trained_kept = shared_trainable_table(model, r.shard, r.model);
  const std::vector<ParamSpec>& trained = *trained_kept;
  const size_t block = GPT::weight_block_bytes(trained, r.shard.tp_size, /*host=*/false);
  // The table adds each category's host and device peaks: the staging
  // (host) and the GEMMs' 16-bit copies (device) count both.
  at(predicted, MemCategory::workspace) =
      std::max(at(predicted, MemCategory::workspace), block) +
      (o.device_workspace ? device_workspace_bytes(model, r, o.precision) : 0);
  // The table of AdamW's segments a GPU keeps (cuda/kernels_cuda.cu).
  if (o.device_workspace) {
    const auto [opt_begin, opt_end] = optimizer_range(trained, r, zero_layout(model, r));
    at(predicted, MemCategory::optimizer) +=
        table_segments(trained, opt_begin, opt_end).size() * sizeof(ops::AdamWSegment);
  }
  // The device's part of the base: the rank's slice of its matrices, and
  // before it (freed first) a leader's chunk under quant.broadcast = nccl.
  if (r.model.lora.enabled)
    at(predicted, MemCategory::quantized) +=
        std::max(GPT::quantized_matrix_bytes(model, r.shard, o.quant_type),
                 r.base_broadcast_bytes);
  return predicted;
}

}  // namespace meshlm
