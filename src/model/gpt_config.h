// The model configuration ([model] section of the parameter file): GPT-2's
// shape, and what a Llama-family model adds (model/param_table.h,
// llama_param_table).
#pragma once

#include <span>
#include <string>

#include "core/enum_names.h"
#include "ops/ops.h"

namespace meshlm {

// The model family: its parameter table, its blocks and its Hugging Face
// layout.
enum class ModelArch : int { gpt2 = 0, llama = 1 };
inline constexpr EnumName<ModelArch> kModelArchNames[] = {
    {ModelArch::gpt2, "gpt2"},
    {ModelArch::llama, "llama"},
};
constexpr std::span<const EnumName<ModelArch>> enum_names(ModelArch) { return kModelArchNames; }

struct GPTConfig {
  int n_layer = 2;        // L
  int n_head = 4;         // NH
  int n_embd = 64;        // C
  int vocab_size = 256;   // V, real tokens
  int max_seq_len = 64;   // GPT-2: rows of the position table wpe; Llama: the longest sequence

  ModelArch arch = ModelArch::gpt2;
  // Llama only (GPT-2 has n_head key/value heads, an MLP of 4 C, LayerNorm
  // with eps 1e-5, learned positions and its classifier tied to wte):
  int n_kv_head = 0;           // key/value heads (grouped-query attention); 0 = n_head
  int intermediate_size = 0;   // the SwiGLU MLP's width F; 0 = 4 C
  double norm_eps = 1e-5;      // RMSNorm's eps (config.json: rms_norm_eps)
  double rope_theta = 10000;   // the rotary embeddings' base
  ops::RopeScaling rope_scaling;    // rope_scaling of type "llama3"; factor 0 = none
  bool tie_word_embeddings = true;  // the classifier is the token embedding (else lm_head)

  // Vp: the vocabulary padded to a multiple of 64 for friendly GEMM shapes.
  int padded_vocab_size() const { return (vocab_size + 63) / 64 * 64; }
  int head_size() const { return n_embd / n_head; }
  int kv_heads() const { return arch == ModelArch::llama && n_kv_head > 0 ? n_kv_head : n_head; }
  // Under tp-way tensor parallelism the key/value heads are split like the
  // query heads when each rank gets whole ones (kv_heads() a multiple of tp),
  // else every rank holds them all (replicated, their gradients summed over
  // the group). The heads a rank holds:
  bool kv_heads_split(int tp) const { return kv_heads() % tp == 0; }
  int kv_heads_held(int tp) const { return kv_heads_split(tp) ? kv_heads() / tp : kv_heads(); }
  int mlp_width() const {
    return arch == ModelArch::llama && intermediate_size > 0 ? intermediate_size : 4 * n_embd;
  }
  // Elements of one block's linear weights, its multiply-adds per token:
  // GPT-2 12 C^2 (c_attn 3, c_proj 1, the MLP 8); Llama 2 C^2 + 2 C Ckv
  // (q and o, k and v) + 3 C F (gate, up, down).
  double block_matmul_elements() const {
    const double C = n_embd, Ckv = double(kv_heads()) * head_size(), F = mlp_width();
    return arch == ModelArch::llama ? 2 * C * C + 2 * C * Ckv + 3 * C * F : 12 * C * C;
  }
  // Whether the classifier is the token embedding (always for GPT-2).
  bool tied_classifier() const { return arch == ModelArch::gpt2 || tie_word_embeddings; }
  // Throws CollectiveError naming the [model] key when impossible.
  void validate() const;
  // "GPT-2 L=12 NH=12 C=768 V=50257", "Llama L=16 NH=32 NKV=8 C=2048 F=8192
  // V=128256 tied": the family and its shape, for the run's lines.
  std::string describe() const;
  bool operator==(const GPTConfig&) const = default;
};

}  // namespace meshlm
