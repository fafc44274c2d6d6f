#include "model/step_declaration.h"

#include <algorithm>

#include "model/activations.h"

namespace meshlm {

namespace {

// A block's linear layer as the parameter table holds it on this rank.
struct BlockLinear {
  LinearSlot slot;
  int OC = 0, IC = 0;  // the local shape (out, in)
};

std::vector<BlockLinear> block_linears(const std::vector<ParamSpec>& table, int layer) {
  std::vector<BlockLinear> out;
  for (const ParamSpec& p : table)
    if (p.layer == layer && p.role == ParamRole::linear_weight && p.slot)
      out.push_back({*p.slot, static_cast<int>(p.shape[0]), static_cast<int>(p.shape[1])});
  return out;
}

class Declarer {
public:
  explicit Declarer(const GPTOptions& o) : o_(o) {}
  StepDeclaration take() { return std::move(d_); }
  StepDeclaration& out() { return d_; }

  void gemm(bool ta, bool tb, int M, int N, int K, int lda, int ldb, long long sa = 0,
            long long sb = 0, int batch = 1, bool a_held = false, bool b_held = false) {
    d_.gemms.push_back({ta, tb, M, N, K, lda, ldb, sa, sb, batch, a_held, b_held});
  }
  void rounds(size_t a, size_t b = 0, size_t c = 0) { d_.roundings.push_back({a, b, c}); }
  void hold(int depth, size_t elements) { d_.holds.push_back({depth, elements}); }

  // A linear layer of n rows, (IC -> OC), with a bias or not: trained (ops::matmul_*), or
  // frozen and quantized (quant::qlinear_*: tiles of tile_rows rows, each
  // with the layer's LoRA adapter merged into it when it has one; the
  // adapter's gradients by model/lora.cpp, with the layer's input and dout
  // held for its backward: GPT::linear_backward).
  void linear(int n, int IC, int OC, bool adapter, int tile_rows, bool bias) {
    if (!o_.lora.enabled) {
      gemm(false, true, n, OC, IC, IC, IC);  // out = inp w^T
      // dinp += dout w and dw += dout^T inp on one copy of dout
      rounds(size_t(n) * OC, size_t(OC) * IC, size_t(n) * IC);
      if (bias) d_.row_sums.push_back({n, size_t(OC)});  // the bias gradient
      return;
    }
    const int tr = std::min(tile_rows, OC);
    gemm(false, true, n, tr, IC, IC, IC);  // out[:, tile] = inp tile^T
    if (!adapter) {
      gemm(false, false, n, IC, tr, OC, IC);  // dinp += dout[:, tile] tile
      return;
    }
    const int r = o_.lora.rank;
    hold(0, size_t(n) * IC);                                    // inp
    hold(1, size_t(n) * OC);                                    // dout
    gemm(false, false, tr, IC, r, r, IC);                       // tile += s B[tile] A
    gemm(false, false, n, IC, tr, OC, IC, 0, 0, 1, true);       // dinp += dout[:, tile] tile
    gemm(false, true, n, r, IC, IC, IC, 0, 0, 1, true);         // u = inp A^T
    gemm(true, false, OC, r, n, OC, r, 0, 0, 1, true);          // dB += s dout^T u
    gemm(false, false, n, r, OC, OC, r, 0, 0, 1, true);         // du = s dout B
    gemm(true, false, r, IC, n, r, IC, 0, 0, 1, false, true);   // dA += du^T inp
  }

private:
  const GPTOptions& o_;
  StepDeclaration d_;
};

}  // namespace

StepDeclaration declare_step(const GPTConfig& m, const ModelShard& shard, const GPTOptions& o,
                             int B, int T) {
  Declarer d(o);
  const int N = B * T, tp = shard.tp_size;
  const int C = m.n_embd, Cl = C / tp, NHl = m.n_head / tp, HS = C / m.n_head;
  const int Vl = m.padded_vocab_size() / tp;
  const bool lora = o.lora.enabled;
  const int tiles = qtile_rows(o);
  // The blocks' linear layers, one of each (every block has the same);
  // GPT-2's have biases, Llama's none.
  const bool llama = m.arch == ModelArch::llama;
  const auto kept = shared_param_table(m, shard);
  const std::vector<ParamSpec>& table = *kept;
  for (const BlockLinear& l : block_linears(table, shard.layer_begin))
    d.linear(N, l.IC, l.OC, lora && o.lora.targets.has(l.slot), tiles, !llama);
  // LayerNorm's dw and db together (RMSNorm's dw alone), where they train.
  if (!lora)
    for (const ParamSpec& p : table)
      if (p.role == ParamRole::ln1_weight || p.role == ParamRole::ln2_weight ||
          p.role == ParamRole::lnf_weight)
        d.out().row_sums.push_back({N, (llama ? 1 : 2) * p.numel()});
  // The token embedding's gradient, summed by index on the first stage.
  if (!lora && shard.first_stage) d.out().embedding_rows = N;
  // The classifier, a chunk of rows at a time (wte, or Llama's lm_head; no
  // adapter).
  // Its weight (wte, or all of it dequantized at once under LoRA) is held
  // rounded for the chunks (Kernels::hold_rounded, GPT::classifier_weight):
  // one copy of this rank's part beside the buffer, none per GEMM. A
  // quantized wte multiplied tile by tile has its tiles rounded per GEMM.
  if (shard.last_stage) {
    const int n_cls = classifier_rows(m, shard, o, size_t(N));
    if (!lora || o.whole_classifier_tile) {
      d.hold(0, size_t(Vl) * C);
      d.rounds(size_t(n_cls) * C);  // logits = x w^T
      // dx = dlogits w, and (full training) dwte += dlogits^T x on the same copy of dlogits
      d.rounds(size_t(n_cls) * Vl, 0, lora ? 0 : size_t(n_cls) * C);
    } else {
      d.linear(n_cls, C, Vl, false, tiles, false);
    }
  }
  if (shard.layer_begin == (shard.layer_end < 0 ? m.n_layer : shard.layer_end))
    return d.take();
  // Flash attention (cuda/flash_attention.cu) rounds qkv(N, 3C) into one
  // buffer, and dout(N, C) beside it in the backward.
  if (o.attention == Attention::flash) {
    d.rounds(size_t(N) * 3 * Cl);
    d.rounds(size_t(N) * 3 * Cl, size_t(N) * Cl);
  }
  // Attention keeping the probabilities (cuda/attention.cu), one sequence
  // at a time, strided-batched over the heads.
  if (o.attention == Attention::probabilities) {
    const long long TT = static_cast<long long>(T) * T;
    d.gemm(false, true, T, T, HS, 3 * Cl, 3 * Cl, HS, HS, NHl);   // S = Q K^T
    d.gemm(false, false, T, HS, T, T, 3 * Cl, TT, HS, NHl);       // Y = P V
    d.gemm(false, true, T, T, HS, Cl, 3 * Cl, HS, HS, NHl);       // dP = dY V^T
    d.gemm(true, false, T, HS, T, T, Cl, TT, HS, NHl);            // dV += P^T dY
    d.gemm(false, false, T, HS, T, T, 3 * Cl, TT, HS, NHl);       // dQ += dS K
    d.gemm(true, false, T, HS, T, T, 3 * Cl, TT, HS, NHl);        // dK += dS^T Q
  }
  return d.take();
}

}  // namespace meshlm
