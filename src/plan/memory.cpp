#include "plan/memory.h"

#include <algorithm>

#include "core/error.h"
#include "model/gpt.h"

namespace meshlm {

ZeroLayout zero_layout(const GPTConfig& cfg, const RankPlan& r) {
  ZeroLayout z;
  z.n = table_numel(trainable_table(cfg, r.shard, r.model));
  const size_t pad = r.model.pad_multiple;
  z.padded = (z.n + pad - 1) / pad * pad;
  z.shard = z.padded / static_cast<size_t>(r.dp);
  return z;
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
  const auto [m0, m1] = optimizer_range(trainable_table(model, r.shard, r.model), r, z);
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

size_t zero2_bucket_numel(const std::vector<ParamSpec>& table, int wte_rows) {
  const ParamSpec* wte = find_role(table, ParamRole::token_embedding);
  const size_t wte_block = wte ? static_cast<size_t>(wte_rows) * wte->shape[1] : 0;
  return std::max(largest_block_numel(table), wte_block);
}

PhasedMemory predict_phases(const GPTConfig& model, const RankPlan& r, uint64_t windows_per_epoch,
                            bool shuffle) {
  const std::vector<ParamSpec> table = trainable_table(model, r.shard, r.model);
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

}  // namespace meshlm
