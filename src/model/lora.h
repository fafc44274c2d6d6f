// LoRA adapters on a frozen base (finetune.mode = lora).
//
// A linear layer y = x W^T + b with W (OC, IC) frozen gets a low-rank update
//   y = x W^T + b + s (x A^T) B^T,    A (r, IC), B (OC, r), s = alpha / r.
// A starts uniform in [-1/sqrt(IC), 1/sqrt(IC)] and B at zero, so the
// adapted model starts as the base model.
//
// The adapter table is derived from the base table (gpt_param_table): for
// every targeted matrix <name> it holds <name>.lora_A and <name>.lora_B, in
// the order of the base table, with layer set, so gradients, AdamW state,
// ZeRO shards and checkpoints of the adapters work exactly as those of full
// training. Tensor parallelism splits the adapters consistently with the
// base matrix:
//   column-parallel W (rows split: c_attn, c_fc): B is split by rows like W
//     (q, k and v each split for c_attn); A is replicated;
//   row-parallel W (columns split: both c_proj): A is split by columns like
//     W; B is replicated.
//   replicated W (Llama's key/value heads when n_kv_head is not a multiple
//     of tp): A and B replicated.
// The replicated factor's gradient is a partial sum on each TP rank (it sees
// only its part of the other factor, or of the output's gradient) and is
// summed over the TP group.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "model/gpt_config.h"
#include "model/linear_slot.h"
#include "ops/kernels.h"

namespace meshlm {

struct ParamSpec;
struct ModelShard;

// finetune.mode: what trains.
enum class FinetuneMode {
  full,  // every parameter
  lora,  // LoRA adapters on a frozen, quantized base ([quant])
};
inline constexpr EnumName<FinetuneMode> kFinetuneModeNames[] = {
    {FinetuneMode::full, "full"},
    {FinetuneMode::lora, "lora"},
};
constexpr std::span<const EnumName<FinetuneMode>> enum_names(FinetuneMode) {
  return kFinetuneModeNames;
}

// [finetune] as the parameter file gives it.
struct FinetuneConfig {
  FinetuneMode mode = FinetuneMode::full;
  int lora_rank = 8;                              // r
  double lora_alpha = 16;                         // adapters scaled by alpha / r
  LinearSlots lora_targets = LinearSlots::of(ModelArch::gpt2);  // matrices with adapters
  // CollectiveError naming the key: rank < 1, alpha <= 0, no target.
  void validate() const;
};

// What the model needs to know of LoRA.
struct LoraOptions {
  bool enabled = false;
  int rank = 8;         // r
  float alpha = 16.0f;  // s = alpha / r
  LinearSlots targets = LinearSlots::of(ModelArch::gpt2);
  float scale() const { return alpha / static_cast<float>(rank); }
  auto operator<=>(const LoraOptions&) const = default;
};
LoraOptions lora_options(const FinetuneConfig& f);

// The adapters of a shard (local shapes, offsets into one flat buffer).
std::vector<ParamSpec> lora_param_table(const GPTConfig& cfg, const ModelShard& shard,
                                        const LoraOptions& lora);

// out(N, OC) += s * (inp(N, IC) A^T) B^T. u (N, r) is scratch and holds
// inp A^T afterwards.
void lora_forward(const ops::Kernels& k, float* out, const float* inp, const float* A,
                  const float* B, float s, int N, int IC, int OC, int r, float* u);
// Backward of lora_forward: dinp += du A, dA += du^T inp, dB += s dout^T u
// with u = inp A^T (recomputed here into `u`) and du = s dout B (left in `du`).
// Any of dinp, dA, dB may be null.
void lora_backward(const ops::Kernels& k, float* dinp, float* dA, float* dB, const float* dout,
                   const float* inp, const float* A, const float* B, float s, int N, int IC, int OC,
                   int r, float* u, float* du);

}  // namespace meshlm
