// Inference with a key/value cache (meshlm generate): the whole model of
// either family on one rank, fp32, its parameters in one flat buffer laid
// out by model_param_table(cfg) (the training model's table, names and
// layout: linear weights (out, in), the vocabulary padded to Vp rows).
//
// forward() runs new tokens at positions [position(), position() + n): the
// prompt once (prefill), then one token per call (decode). Each layer's keys
// and values of every position run so far stay in the cache, so a new
// token costs one position's forward against them: the model's GEMMs on one
// row (a pass over the weights) plus its attention over the positions
// before it, never the quadratic recomputation of the whole sequence. The
// prefill runs at most kChunkRows rows at a time (the later rows of a long
// prompt attend to the cached earlier ones), so its scratch is bounded.
//
// Per layer, with x the residual stream (rows, C):
//   GPT-2:  qkv = c_attn(layernorm_1(x)); k, v appended to the cache;
//           x += c_proj(attn(q, K, V)); x += c_proj(gelu(c_fc(layernorm_2(x))))
//           with the position table's rows [pos, pos + n) added to the
//           token embeddings first;
//   Llama:  q, k, v of rmsnorm_1(x), q and k turned by the rotary embeddings
//           of their positions (Llama 3 scaling), k, v appended;
//           x += o(attn(q, K, V)) with query head h reading key/value head
//           h / (NH / NKV); x += down(silu(gate(h)) * up(h)), h = rmsnorm_2(x).
// then the final norm and the classifier (wte tied, or Llama's lm_head):
// logits (rows, Vp), the padded columns [V, Vp) zero weights' logits that a
// caller must never choose.
//
// The ops are those of training (ops::Kernels: matmul, layernorm, rmsnorm,
// rope, gelu, swiglu, residual) and the attention against the cache
// (Kernels::cached_attention_forward), on the backend the Kernels give: the
// CPU's, or a device's (runtime.backend = cuda or emulated), where the
// parameters, the cache and the scratch live in the device's memory and
// only the new tokens go up and the logits asked for come down. On the CPU
// a single row's products (a decoding step's) are BLAS matrix-vector
// products.
//
// Memory (tracked, on the backend's device): params (the model),
// activations (the cache: 2 L T Ckv floats for a context of T positions,
// Ckv = NKV HS), workspace (the scratch of kChunkRows rows, the attention's
// scores, the rotary tables; on a device also the token ids and the logits
// of the rows asked for, and while load() runs a host buffer of the largest
// tensor).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/alloc.h"
#include "model/gpt_config.h"
#include "model/linear_slot.h"
#include "model/param_table.h"
#include "ops/kernels.h"

namespace meshlm {

class Decoder {
public:
  // Query rows of the prefill run at once (its scratch's rows).
  static constexpr int kChunkRows = 128;

  // The model `cfg` (validated by the caller) for sequences of at most
  // `context` positions (<= cfg.max_seq_len), on the backend of `kernels`.
  // Parameters start zero: load() them (or, on the CPU, fill params(), as
  // table() says) before the first forward(). `chunk_rows` (tests) bounds
  // the rows run at once.
  Decoder(const GPTConfig& cfg, int context, int chunk_rows = kChunkRows,
          const ops::Kernels& kernels = ops::Kernels::cpu());

  const GPTConfig& config() const { return cfg_; }
  const std::vector<ParamSpec>& table() const { return table_; }
  // The parameters, in the backend's memory (the host's on the CPU).
  float* params() { return params_.as<float>(); }
  // Sets every tensor of table(): read(p, out) writes tensor p's p.numel()
  // values to `out`, host memory (on a device, a buffer of the largest
  // tensor, uploaded after each).
  using TensorReader = std::function<void(const ParamSpec&, float*)>;
  void load(const TensorReader& read);
  int context() const { return context_; }
  // Positions run so far (held in the cache).
  int position() const { return pos_; }
  // Forgets the cached positions (the next forward starts at position 0).
  void reset() { pos_ = 0; }

  // Runs tokens[0, n) (host memory, each in [0, V)) at positions
  // [position(), position() + n), n >= 1 and position() + n <= context(),
  // and appends their keys and values to the cache. logits (host memory):
  // (n, Vp) with all_rows, else (1, Vp) of the last token (what predicts the
  // next one). Throws RankError for an id out of range or a sequence past
  // the context.
  void forward(const int32_t* tokens, int n, float* logits, bool all_rows = false);

private:
  // One block's tensors, found by role in the table.
  struct Layer {
    const float *ln1w = nullptr, *ln1b = nullptr, *ln2w = nullptr, *ln2b = nullptr;
    std::array<const float*, kLinearSlots> w{}, b{};
  };
  void find_tensors();
  void linear(float* out, const float* inp, const float* w, const float* bias, int n, int IC,
              int OC) const;
  void forward_rows(const int32_t* tokens, int n, float* logits, bool all_rows);
  void gpt2_block(const Layer& w, int l, int n);
  void llama_block(const Layer& w, int l, int n);
  // Appends rows [pos_, pos_ + n) of layer l's keys k and values v (rows ld
  // floats apart) to the cache, then atty(n, C) = the attention of the
  // queries q (rows ldq apart) against it.
  void attend(int l, const float* q, size_t ldq, const float* k, const float* v, size_t ld, int n);

  GPTConfig cfg_;
  int context_, chunk_;
  const ops::Kernels* k_;
  bool on_host_;  // the CPU backend: the caller's tokens and logits used in place
  std::vector<ParamSpec> table_;
  Buffer params_;
  int C_, HS_, NH_, NKV_, Ckv_, F_, Vp_;
  bool llama_;
  const float *wte_ = nullptr, *wpe_ = nullptr, *lnfw_ = nullptr, *lnfb_ = nullptr,
              *cls_ = nullptr;
  std::vector<Layer> layers_;
  int pos_ = 0;
  Buffer cache_;  // per layer: K (context, Ckv), then V (context, Ckv)
  Buffer work_;   // the scratch arrays below
  float *x_, *ln_, *q_, *kk_, *vv_, *atty_, *proj_, *fc_, *fc2_, *mean_, *rstd_, *rope_cos_,
      *rope_sin_, *scores_;
  size_t scores_floats_ = 0;
  int32_t* ids_ = nullptr;  // a device's copy of the chunk's tokens
  Buffer logits_;           // a device's logits of the rows asked for (grown as needed)
};

}  // namespace meshlm
