#include "plan/memory.h"

#include <algorithm>

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
    if (p.layer < 0) n += p.numel();
  return n;
}

MemoryByCategory predict_memory(const GPTConfig& model, const RankPlan& r,
                                uint64_t windows_per_epoch, bool shuffle) {
  MemoryByCategory m{};
  const std::vector<ParamSpec> table = trainable_table(model, r.shard, r.model);
  const ZeroLayout z = zero_layout(model, r);
  constexpr size_t f = sizeof(float);
  at(m, MemCategory::params) = z.padded * f;
  if (r.model.lora.enabled) at(m, MemCategory::params) += GPT::frozen_numel(model, r.shard) * f;
  at(m, MemCategory::quantized) = r.quantized_bytes;
  at(m, MemCategory::grads) = r.zero_stage < 2
                                  ? z.padded * f
                                  : (z.shard + largest_block_numel(table) + edge_numel(table)) * f;
  at(m, MemCategory::optimizer) = 2 * (r.zero_stage == 0 ? z.n : z.shard) * f;
  at(m, MemCategory::activations) =
      GPT::activation_bytes(model, r.shard, r.model, r.micro_batch, r.seq_len);
  if (r.pipeline_stage > 0)
    at(m, MemCategory::comm) = static_cast<size_t>(r.model.slots) * r.micro_batch * r.seq_len *
                               model.n_embd * f;
  if (r.shard.tp_size > 1) {
    size_t largest = 0;
    for (const ParamSpec& p : table)
      if (p.tp_dim >= 0) largest = std::max(largest, static_cast<size_t>(p.full_shape.numel()));
    at(m, MemCategory::workspace) = largest * f;
  }
  at(m, MemCategory::workspace) = std::max(at(m, MemCategory::workspace), r.base_staging_bytes);
  at(m, MemCategory::other) = shuffle ? windows_per_epoch * sizeof(uint32_t) : 0;
  return m;
}

MemoryByCategory predict_memory(const GPTConfig& model, int micro_batch_size, int seq_len,
                                uint64_t windows_per_epoch, bool shuffle) {
  RankPlan r;
  r.micro_batch = micro_batch_size;
  r.seq_len = seq_len;
  return predict_memory(model, r, windows_per_epoch, shuffle);
}

}  // namespace meshlm
