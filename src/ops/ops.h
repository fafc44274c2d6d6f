// The ops interface: the forward/backward pairs a GPT-2 or Llama step is made of.
// This header declares the CPU implementation (OpenMP loops + BLAS), which is
// the readable reference every other backend is tested against; cuda/ holds
// the CUDA implementation of the same ops (cuda/ops_cuda.h).
//
// Dimension letters (used in every shape comment of meshlm):
//   B  batch (sequences in a micro-batch)    T  sequence length
//   C  channels (n_embd)                     NH heads, HS = C / NH head size
//   V  vocabulary, Vp padded to a multiple of 64
//   L  layers                                N  = B * T rows, when flattened
//
// Conventions:
//   * Every op is a template instantiated for float (training) and double
//     (finite-difference gradient checks in tests/).
//   * Forward ops overwrite their outputs.
//   * Backward ops ACCUMULATE (+=) into parameter gradients and into the
//     gradient of the residual stream (layernorm's dinp, residual_backward,
//     the embeddings): this makes residual branches and gradient
//     accumulation free. The input gradients of the linear layer, attention
//     and GELU, each a branch's own scratch, are OVERWRITTEN: no pass over
//     memory to zero them first, none to read them back.
//   * Linear weights are stored (OC, IC), as torch.nn.Linear: y = x W^T + b.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ops/precision.h"

namespace meshlm::ops {

// ---- embeddings -------------------------------------------------------------
// out(B,T,C) = wte[tokens[b,t]] + wpe[t], built in two steps so that wte can be
// split over the tensor-parallel group (with one rank, v0 = 0 and Vl = Vp).
//
// Vocabulary-parallel token embedding: this rank holds rows [v0, v0 + Vl) of
// wte. out(N,C) = wte_part[token - v0] for tokens in range, 0 elsewhere, so a
// sum over the tensor-parallel group gives wte[token].
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte_part, int N, int C, int v0, int Vl);
// dwte_part[token - v0] += dout[n] for tokens in range.
template <typename T>
void embedding_backward(T* dwte_part, const T* dout, const int32_t* tokens, int N, int C, int v0,
                        int Vl);
// out(B,T,C) += wpe[t];  dwpe[t] += sum_b dout[b,t]
template <typename T>
void position_forward(T* out, const T* wpe, int B, int Tn, int C);
template <typename T>
void position_backward(T* dwpe, const T* dout, int B, int Tn, int C);

// ---- layer norm (eps = 1e-5, as GPT-2) ------------------------------------------
// out(N,C) = (inp - mean) * rstd * w + b; mean(N), rstd(N) saved for backward.
// In backward, dw and db may be null together (frozen gain and bias).
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int N, int C);
template <typename T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                        const T* mean, const T* rstd, int N, int C);
// res(N,C) = a + b, then out = layernorm(res): the bits of residual_forward
// followed by layernorm_forward, in one pass over the rows.
template <typename T>
void residual_layernorm_forward(T* res, T* out, T* mean, T* rstd, const T* a, const T* b,
                                const T* w, const T* bias, int N, int C);

// ---- linear layer -----------------------------------------------------------
// out(N,OC) = inp(N,IC) w(OC,IC)^T + bias(OC); bias may be null. Under a
// precision other than fp32 every GEMM of the op rounds its two inputs to it
// (ops/precision.h); the double ops take fp32 only.
template <typename T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int IC, int OC,
                    Precision p = Precision::fp32);
// dinp(N,IC) = dout w; dw(OC,IC) += dout^T inp; dbias(OC) += sum_n dout (each if non-null).
template <typename T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int N,
                     int IC, int OC, Precision p = Precision::fp32);

// ---- causal self-attention --------------------------------------------------
// qkv(B,T,3C) holds q, k, v side by side; head h uses channels [h*HS, (h+1)*HS)
// of each. att(B,NH,T,T) keeps the softmax probabilities (zero above the
// diagonal) for backward. out(B,T,C) = concat_h softmax(q k^T / sqrt(HS)) v.
// Under bf16/fp16 the GEMMs (S = Q K^T, Y = P V and their backward) round
// their inputs; the softmax and the kept probabilities stay fp32.
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH,
                       Precision p = Precision::fp32);
// dqkv(B,T,3C) is overwritten; datt(B,NH,T,T) is scratch (overwritten).
template <typename T>
void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att, int B, int Tn,
                        int C, int NH, Precision p = Precision::fp32);

// The same function keeping only lse(B,NH,T), each row's log-sum-exp of its
// scaled scores, instead of the probabilities (train.attention = flash): the
// backward recomputes P = exp(q k^T / sqrt(HS) - lse) a block of rows at a
// time from qkv, and takes sum_s P dP as dout . out. The GEMMs round their
// inputs as attention_* does. dqkv is overwritten; delta(B,NH,T) is scratch
// (overwritten).
// The precisions and head sizes the GPU's fused kernel covers
// (cuda/flash_attention.cu): it multiplies 16-bit tiles on the tensor cores.
constexpr bool flash_attention_on_gpu(Precision p, int head_size) {
  return p != Precision::fp32 &&
         (head_size == 16 || head_size == 32 || head_size == 64 || head_size == 128);
}
template <typename T>
void flash_attention_forward(T* out, T* lse, const T* qkv, int B, int Tn, int C, int NH,
                             Precision p = Precision::fp32);
template <typename T>
void flash_attention_backward(T* dqkv, T* delta, const T* dout, const T* out, const T* qkv,
                              const T* lse, int B, int Tn, int C, int NH,
                              Precision p = Precision::fp32);

// ---- GELU, tanh approximation (as GPT-2) ------------------------------------
// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <typename T>
void gelu_forward(T* out, const T* inp, size_t n);
// dinp = gelu'(inp) dout (overwritten).
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n);

// ---- Llama's ops: RMSNorm, rotary position embeddings, SwiGLU ---------------
// out(N,C) = w * (inp * rstd), rstd(N) = 1 / sqrt(mean_c(inp^2) + eps), kept
// for backward (no bias; Hugging Face's LlamaRMSNorm in fp32).
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int N, int C, double eps);
// dinp(N,C) += d out / d inp applied to dout; dw(C) += sum_n dout * inp * rstd
// (dw may be null: a frozen gain).
template <typename T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd,
                      int N, int C);
// res(N,C) = a + b, then out = rmsnorm(res): the bits of residual_forward
// followed by rmsnorm_forward, in one pass over the rows (Llama's block:
// the attention branch's residual add and the MLP's norm).
template <typename T>
void residual_rmsnorm_forward(T* res, T* out, T* rstd, const T* a, const T* b, const T* w, int N,
                              int C, double eps);

// Llama 3's rope scaling (rope_scaling.rope_type = "llama3"); factor 0: none.
struct RopeScaling {
  double factor = 0, low_freq_factor = 1, high_freq_factor = 4;
  int original_max_positions = 8192;
  bool operator==(const RopeScaling&) const = default;
};
// inv_freq(HS/2) = theta^(-2i / HS), scaled as `s` says, in float as Hugging
// Face's rotary embedding computes it.
void rope_inv_freq(float* inv_freq, int HS, double theta, const RopeScaling& s);
// cos and sin(Tn, HS/2) of the angles t * inv_freq[i] (the angle a float
// product) for positions t = 0 .. Tn-1.
template <typename T>
void rope_tables(T* cos, T* sin, const float* inv_freq, int Tn, int HS);
// In place on `heads` heads of HS channels at the start of each row (b, t)
// of x, rows `ld` apart (q or k inside a packed buffer): with h = HS/2 and
// the angle of (t, i), x_i' = x_i cos - x_{i+h} sin, x_{i+h}' = x_{i+h} cos +
// x_i sin (rotate-half). cos and sin from rope_tables; a position offset is
// an offset of the tables.
template <typename T>
void rope_forward(T* x, const T* cos, const T* sin, int B, int Tn, int heads, int HS, size_t ld);
// The gradient through it, in place: the rotation by the opposite angle.
template <typename T>
void rope_backward(T* dx, const T* cos, const T* sin, int B, int Tn, int heads, int HS,
                   size_t ld);

// out(N,F) = silu(gate) * up, silu(x) = x / (1 + e^-x); gate and up rows
// `ld` apart (separate buffers: ld = F; one packed (N, 2F) buffer: ld = 2F).
template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int N, int F, size_t ld);
// dgate and dup (rows ld apart) are overwritten.
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int N, int F,
                     size_t ld);

// Which of the key/value heads a rank holds each of its NH query heads
// reads: query head h is the model's head q_head0 + h and reads held head
// (q_head0 + h) / group. A rank with every head, or with its share of both
// query and key/value heads (tensor parallelism, NKV a multiple of tp):
// q_head0 0, group NH / NKV (group 0 means that). A rank whose key/value
// heads are replicated (NKV not a multiple of tp): q_head0 its first query
// head, group the model's n_head / n_kv_head.
struct GqaMap {
  int q_head0 = 0, group = 0;
};

// Grouped-query attention (NKV key/value heads held, each shared by `group`
// query heads): qkv(N, 3C), C = NH HS, the packed layout the attention ops
// read, from q(N, C), k(N, NKV HS) and v(N, NKV HS), query head h beside
// the key/value head `m` gives it. NKV = NH copies q, k and v side by side.
template <typename T>
void gqa_pack_forward(T* qkv, const T* q, const T* k, const T* v, int N, int NH, int NKV, int HS,
                      GqaMap m = {});
// dq, dk and dv overwritten from dqkv: dk and dv each the sum over the query
// heads that read it, in order (zero for a held head none of them reads).
template <typename T>
void gqa_pack_backward(T* dq, T* dk, T* dv, const T* dqkv, int N, int NH, int NKV, int HS,
                       GqaMap m = {});

// ---- attention against a key/value cache (meshlm generate) --------------------
// n new rows at positions [p0, p0 + n): their keys k and values v (n, Ckv),
// Ckv = NKV HS, rows ldkv apart) are first written to rows [p0, p0 + n) of
// the caches kc and vc (positions, Ckv), then out(n, NH HS) = softmax(q
// K^T / sqrt(HS)) V with row i seeing the cached positions [0, p0 + i],
// query head h (q rows ldq apart) reading key/value head h / (NH / NKV). The
// scores of a block of query rows are one GEMM per head (a matrix-vector
// product for one row, a decoding step's), rounded to `p` as gemm() does.
// `scratch` holds `scratch_floats` floats, at least
// cached_attention_scratch(n, p0 + n, 1); more lets more threads work.
constexpr int kCachedAttentionRows = 64;  // query rows of one head per GEMM
size_t cached_attention_scratch(int n, int keys, int threads);
void cached_attention_forward(float* out, float* kc, float* vc, const float* q, size_t ldq,
                              const float* k, const float* v, size_t ldkv, int n, int p0, int NH,
                              int NKV, int HS, float* scratch, size_t scratch_floats,
                              Precision p = Precision::fp32);

// ---- residual ---------------------------------------------------------------
template <typename T>
void residual_forward(T* out, const T* a, const T* b, size_t n);
// da += dout; db += dout
template <typename T>
void residual_backward(T* da, T* db, const T* dout, size_t n);

// ---- vocabulary-parallel softmax cross-entropy (Megatron) -----------------------
// logits(N,Vl) hold columns [v0, v0 + Vl) of the padded vocabulary (with one
// rank, v0 = 0 and Vl = Vp). Columns at or beyond V are padding and take no
// part: probability 0 (they never win, whatever their value) and exactly zero
// gradient. Targets must lie in [0, V). The full softmax is assembled
// from per-rank pieces with two reductions over the tensor-parallel group, so
// the full logits are never gathered:
//   1. xent_local_max:  rowmax(N) = max of this rank's real columns (-inf if none)
//      -> MAX over the group
//   2. xent_local_sums: sums(N,2) = [sum exp(l - rowmax), logit of the target if
//      this rank holds it, else 0] -> SUM over the group
//   3. xent_losses:     losses(N) = log(sums[n,0]) + rowmax[n] - sums[n,1]
// Backward, in place: dlogits = (exp(l - rowmax) / sums[n,0] - [v == target]) * dlosses[n],
// padded columns exactly 0.
template <typename T>
void xent_local_max(T* rowmax, const T* logits, int N, int Vl, int v0, int V);
template <typename T>
void xent_local_sums(T* sums, const T* logits, const T* rowmax, const int32_t* targets, int N,
                     int Vl, int v0, int V);
template <typename T>
void xent_losses(T* losses, const T* rowmax, const T* sums, int N);
template <typename T>
void xent_local_backward(T* logits_dlogits, const T* rowmax, const T* sums, const T* dlosses,
                         const int32_t* targets, int N, int Vl, int v0, int V);
// Rows holding the whole vocabulary (one tensor-parallel rank: v0 = 0,
// V <= Vl): xent_local_max, xent_local_sums and, where dlosses is not null,
// xent_local_backward in place, one row after the other while it is in
// cache: the bits of the three ops.
template <typename T>
void xent_rows(T* logits_dlogits, T* rowmax, T* sums, const T* dlosses, const int32_t* targets,
               int N, int Vl, int V);

// ---- optimizer (float only) ---------------------------------------------------
// One run of AdamW's elements that share their weight decay: elements
// [begin, begin + count) of the arrays given to adamw_update.
struct AdamWSegment {
  size_t begin = 0, count = 0;
  bool decay = false;  // matrices: p *= 1 - lr wd first
};
// The hyperparameters of one step, rounded to float once (train/adamw.h).
struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;       // 1 - beta1^t
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  // The gradient each element reads is (grads * unscale) * clip: the fp16
  // loss scale undone, then the global-norm clip, fused into the update (the
  // bits of scaling the gradients in place first; a factor of 1 is exact).
  float unscale = 1.0f, clip = 1.0f;
};
// AdamW over every segment, in float: per element, g = (grads unscale) clip;
// m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p = p decay - lr / bc1 * m / (sqrt(v) / bc2_sqrt + eps).
void adamw_update(float* params, const float* grads, float* m, float* v,
                  std::span<const AdamWSegment> segments, const AdamWHyper& h);
// sum x^2 over n elements in double, in a fixed order (blocks of
// kSumOfSquaresBlock elements, each a SIMD reduction, then their sums in
// order): the same bits for any number of threads. The CUDA backend sums the
// same blocks in the same order, each as a tree: equal within rounding.
inline constexpr size_t kSumOfSquaresBlock = size_t(1) << 16;
double sum_of_squares(const float* x, size_t n);
// x(n) *= factor
void scale(float* x, float factor, size_t n);
// out[0] = (sum of x(n) in double, in order) / n, rounded to float (a
// micro-batch's mean loss from its rows'); n >= 1.
void mean(float* out, const float* x, size_t n);

}  // namespace meshlm::ops
