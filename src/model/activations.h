// The activation layout of one rank's GPT shard: every array a forward
// keeps for the backward of each activation slot (pipeline micro-batch in
// flight), and the gradients and scratch one backward uses, cut from two
// allocations. The planner sizes activation memory from the same layout.
//
// Local sizes per micro-batch of (B, T), N = B T, with tensor parallelism
// tp: C, Cl = C / tp, NHl = NH / tp, Fl = 4C / tp (Llama: F / tp), Vl = Vp / tp,
// Llama's Ckvl = NKV HS / tp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "model/gpt_config.h"
#include "model/gpt_options.h"
#include "model/param_table.h"

namespace meshlm {

// What one block's forward keeps.
struct BlockActs {
  float* ln1;       // (B,T,C)
  float* ln1_mean;  // (B,T)
  float* ln1_rstd;  // (B,T)
  float* qkv;       // (B,T,3Cl)
  float* atty;      // (B,T,Cl)
  float* att;       // (B,NHl,T,T) probabilities, or (B,NHl,T) log-sum-exp under flash
  float* attproj;   // (B,T,C)
  float* res2;      // (B,T,C) residual after attention
  float* ln2;       // (B,T,C)
  float* ln2_mean;  // (B,T)
  float* ln2_rstd;  // (B,T)
  float* fch;       // (B,T,Fl)  Llama: the gate projection
  float* fch_gelu;  // (B,T,Fl)  Llama: silu(gate) * up
  float* fcproj;    // (B,T,C)
  float* res3;      // (B,T,C) residual after the MLP = block output
  float* up;        // (B,T,Fl) Llama: the up projection (null for GPT-2)
};

// The activations of one micro-batch. With checkpointing, only input and
// every block's res3 are per slot; the other block arrays point into one
// shared block (ActLayout::recompute) refilled by the block's forward in
// backward.
struct SlotActs {
  float* input;  // (B,T,C) embedding output, or the activations received
  std::vector<BlockActs> blocks;
  float* lnf;        // (B,T,C)
  float* lnf_mean;   // (B,T)
  float* lnf_rstd;   // (B,T)
  float* dlnf;       // (B,T,C) d loss / d lnf from the classifier (this rank's vocabulary part)
  float* losses;     // (B,T)
  float* xent_max;   // (B,T) row max over the whole vocabulary
  float* xent_sums;  // (B,T,2) sum exp(l - max), target logit
  int32_t* tokens;   // (B,T) first stage: the micro-batch's tokens, where the ops read them
  int32_t* targets;  // (B,T) last stage: its targets
  bool forwarded = false;
  // The loss scale of the classifier's backward when forward() ran it
  // (GPT::forward's head_grad_scale); unset: backward() runs it.
  std::optional<float> head_scale;
};

// One backward's gradients of activations and scratch, shared by the slots.
struct GradActs {
  float* dres;       // (B,T,C) gradient of the residual stream
  float* dln;        // (B,T,C)
  float* dqkv;       // (B,T,3Cl)
  float* datty;      // (B,T,Cl)
  float* datt;       // (B,NHl,T,T) scratch, or (B,NHl,T) under flash
  float* dfch;       // (B,T,Fl)
  float* dfch_gelu;  // (B,T,Fl)
  float* dlosses;    // (B,T)
  // (micro_batches) each micro-batch's mean loss, kept on the backend until
  // the step reads them at once (last stage; GPT::forward_queued)
  float* loss_means;
  float* logits;     // (rows, Vl) one chunk of the classifier's logits, then its dlogits
  // LoRA / quantized base scratch (null in full training)
  float* lora_u;     // (B*T, r)
  float* lora_du;    // (B*T, r)
  float* lora_tmp;   // (r*C) a replicated adapter's partial gradient, summed over TP;
                     // (r*(C + Ckvl)) with replicated key/value heads (both factors)
  float* qtile;      // (qtile_rows, max(C, Fl)) dequantized rows of a frozen matrix
  float* wpe_rows;   // (T, C) dequantized positions (first stage)
  // Llama (null for GPT-2): the gradients of q, k and v (the forward's
  // projections before the rotary embeddings and the packing, in the
  // forward), of the up projection, a second (B,T,C) input gradient, and
  // the rotary tables (T, HS/2), constant.
  float* dq;         // (B,T,Cl)
  float* dk;         // (B,T,Ckvl)
  float* dv;         // (B,T,Ckvl)
  float* dup;        // (B,T,Fl)
  float* dln2;       // (B,T,C)
  float* rope_cos;
  float* rope_sin;
  // Key/value heads replicated over tp > 1, full training: one k or v
  // weight's partial gradient (Ckv, C), summed over TP (null otherwise).
  float* kv_dw;
};

// Every array in allocation order, then bound to two buffers by bind().
struct ActLayout {
  std::vector<SlotActs> slots;
  BlockActs recompute{};
  GradActs g{};
  struct Cut {
    float** ptr;  // where the array's pointer goes
    size_t n;     // floats (or int32 ids)
    bool grad;    // in the gradient buffer
    int32_t** ids = nullptr;  // instead of ptr: an array of token ids (4 bytes each, like a float)
  };
  std::vector<Cut> cuts;
  size_t act_floats = 0, grad_floats = 0;
  // Set before plan_activations: only act_floats and grad_floats are
  // counted, no slot or cut is kept (activation_bytes, for the planner).
  bool count_only = false;

  // Sets every pointer into `acts` (act_floats) and `grads` (grad_floats).
  // Under full checkpointing the slots' blocks then share `recompute` for
  // all but their output.
  void bind(float* acts, float* grads, Checkpointing checkpointing);
};

// The classifier (the tied lm_head with softmax cross-entropy) computes its
// logits `rows` at a time, so the (B, T, Vl) logits never exist: at most
// kClassifierChunkFloats of them (128 MiB of fp32) unless GPTOptions::
// classifier_rows says otherwise; the N rows in as few chunks as that
// allows, all of one size (the last may be shorter by less than the number
// of chunks). Between 1 and N rows. Each chunk's GEMMs read (and BLAS
// packs) all of wte twice and add into all of its gradient once, so fewer
// chunks are faster: on the CPU, GPT-2's 2048 rows in 4 chunks of 512
// instead of 7 of 293 (64 MiB) take a step about 4% faster (L=6 C=384,
// docs/PERFORMANCE.md) for 34 MiB more.
constexpr size_t kClassifierChunkFloats = size_t(1) << 25;
int classifier_rows(const GPTConfig& cfg, const ModelShard& shard, const GPTOptions& opts, size_t N);
// Rows of this rank's vocabulary part (of Vl) whose token-embedding gradient
// is made at once when it is made in blocks (GPT::set_wte_grad_blocks): as
// many as the classifier's logits buffer holds for N tokens, at most Vl.
int wte_grad_rows(const GPTConfig& cfg, const ModelShard& shard, const GPTOptions& opts, size_t N);

// Rows of a frozen quantized matrix dequantized per GEMM (GPTOptions::qtile_rows).
int qtile_rows(const GPTOptions& opts);

// Fills `L` (empty) with the layout for micro-batches of (B, Tn). Its cuts
// point into `L` itself: bind it where it is, then copy out what is needed.
void plan_activations(const GPTConfig& cfg, const ModelShard& shard, const GPTOptions& opts, int B,
                      int Tn, ActLayout& L);

// Bytes of activations the shard keeps for micro-batches of (B, Tn).
size_t activation_bytes(const GPTConfig& cfg, const ModelShard& shard, const GPTOptions& opts,
                        int B, int Tn);

}  // namespace meshlm
