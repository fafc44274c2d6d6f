#include "model/lora.h"

#include <cmath>

#include "core/error.h"
#include "model/param_table.h"
#include "ops/kernels.h"

namespace meshlm {

void FinetuneConfig::validate() const {
  if (lora_rank < 1)
    throw CollectiveError("finetune.lora_rank must be >= 1 (got " + std::to_string(lora_rank) + ")",
                          MESHLM_HERE);
  if (!(lora_alpha > 0 && std::isfinite(lora_alpha)))
    throw CollectiveError("finetune.lora_alpha must be finite and > 0", MESHLM_HERE);
  if (lora_targets.empty())
    throw CollectiveError("finetune.lora_targets must name at least one of " +
                              enum_choices<LinearSlot>(", "),
                          MESHLM_HERE);
}

LoraOptions lora_options(const FinetuneConfig& f) {
  LoraOptions o;
  o.enabled = f.mode == FinetuneMode::lora;
  o.rank = f.lora_rank;
  o.alpha = static_cast<float>(f.lora_alpha);
  o.targets = f.lora_targets;
  return o;
}

std::vector<ParamSpec> lora_param_table(const GPTConfig& cfg, const ModelShard& shard,
                                        const LoraOptions& lora) {
  MESHLM_CHECK(lora.rank >= 1, "LoRA rank must be >= 1");
  const int tp = shard.tp_size, le = shard.layer_end < 0 ? cfg.n_layer : shard.layer_end;
  // Every tensor of the model, split as over this tp (which of Llama's
  // key/value weights are replicated depends on it).
  const auto full_kept = shared_param_table(cfg, ModelShard{.tp_size = tp});
  const std::vector<ParamSpec>& full = *full_kept;
  const int64_t r = lora.rank;
  TableBuilder t(tp);  // index: position in the whole model's adapter table
  for (const ParamSpec& w : full) {
    if (w.role != ParamRole::linear_weight || !lora.targets.has(*w.slot)) continue;
    const int64_t OC = w.full_shape.dims[0], IC = w.full_shape.dims[1];
    const bool mine = shard.layer_begin <= w.layer && w.layer < le;
    // A replicated W (Llama's key/value heads when they do not split over
    // tp) gets both factors replicated.
    const bool column_parallel = w.tp_dim == 0, row_parallel = w.tp_dim == 1;
    t.add({.name = w.name + ".lora_A", .shape = {}, .tp_dim = row_parallel ? 1 : -1, .layer = w.layer,
           .full_shape = {r, IC}, .role = ParamRole::lora_a, .slot = w.slot,
           .init = InitKind::kaiming_uniform},
          mine);
    t.add({.name = w.name + ".lora_B", .shape = {}, .tp_dim = column_parallel ? 0 : -1, .layer = w.layer,
           .full_shape = {OC, r}, .tp_parts = column_parallel ? w.tp_parts : 1,
           .role = ParamRole::lora_b, .slot = w.slot, .init = InitKind::zeros},
          mine);
  }
  return t.take();
}

void lora_forward(const ops::Kernels& k, float* out, const float* inp, const float* A,
                  const float* B, float s, int N, int IC, int OC, int r, float* u) {
  k.gemm(false, true, N, r, IC, 1.0f, inp, IC, A, IC, 0.0f, u, r);  // u = inp A^T
  k.gemm(false, true, N, OC, r, s, u, r, B, r, 1.0f, out, OC);      // out += s u B^T
}

void lora_backward(const ops::Kernels& k, float* dinp, float* dA, float* dB, const float* dout,
                   const float* inp, const float* A, const float* B, float s, int N, int IC, int OC,
                   int r, float* u, float* du) {
  k.gemm(false, true, N, r, IC, 1.0f, inp, IC, A, IC, 0.0f, u, r);                  // u = inp A^T
  if (dB) k.gemm(true, false, OC, r, N, s, dout, OC, u, r, 1.0f, dB, r);            // dB += s dout^T u
  k.gemm(false, false, N, r, OC, s, dout, OC, B, r, 0.0f, du, r);                   // du = s dout B
  if (dA) k.gemm(true, false, r, IC, N, 1.0f, du, r, inp, IC, 1.0f, dA, IC);        // dA += du^T inp
  if (dinp) k.gemm(false, false, N, IC, r, 1.0f, du, r, A, IC, 1.0f, dinp, IC);     // dinp += du A
}

}  // namespace meshlm
