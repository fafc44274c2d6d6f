#include "model/gpu_step.h"

#include <algorithm>

#include "model/activations.h"
#include "ops/gpu_workspace.h"

namespace meshlm {

size_t gpu_gemm_copies_bytes(const GPTConfig& m, const ModelShard& shard, const GPTOptions& o,
                             ops::Precision p, int B, int T) {
  if (p == ops::Precision::fp32) return 0;
  const int N = B * T, C = m.n_embd, NH = m.n_head, HS = C / NH;
  const int Vp = m.padded_vocab_size();
  size_t most = 0;
  // Each GEMM rounds the spans of its inputs that no hold covers
  // (Kernels::hold_rounded); `a_held` and `b_held` mark the covered ones.
  auto gemm = [&](bool ta, bool tb, int M, int Nn, int K, int lda, int ldb, long long sa = 0,
                  long long sb = 0, int batch = 1, bool a_held = false, bool b_held = false) {
    const auto [a, b] = ops::gemm_input_spans(ta, tb, M, Nn, K, lda, ldb, sa, sb, batch);
    most = std::max(most, ops::gemm_16bit_copies_bytes(a_held ? 0 : a, b_held ? 0 : b));
  };
  // The held copies: a buffer per depth of nesting, each as large as the
  // largest span held at its depth.
  size_t held[2] = {0, 0};
  auto hold = [&](int depth, size_t elements) { held[depth] = std::max(held[depth], 2 * elements); };
  // A linear layer of n rows, (IC -> OC), trained (ops::matmul_*) or frozen
  // and quantized (quant::qlinear_*: tiles of tile_rows rows, each with the
  // layer's LoRA adapter of rank r merged into it when it has one; the
  // adapter's gradients by model/lora.cpp, with the layer's input and dout
  // held for its backward: GPT::linear_backward).
  auto linear = [&](int n, int IC, int OC, bool adapters, int tile_rows) {
    if (!o.lora.enabled) {
      gemm(false, true, n, OC, IC, IC, IC);  // out = inp w^T
      // dinp += dout w and dw += dout^T inp on one copy of dout
      most = std::max(most, ops::gemm_16bit_copies_bytes(size_t(n) * OC, size_t(OC) * IC,
                                                         size_t(n) * IC));
      return;
    }
    const int tr = std::min(tile_rows, OC);
    gemm(false, true, n, tr, IC, IC, IC);  // out[:, tile] = inp tile^T
    if (!adapters) {
      gemm(false, false, n, IC, tr, OC, IC);  // dinp += dout[:, tile] tile
      return;
    }
    const int r = o.lora.rank;
    hold(0, size_t(n) * IC);                                    // inp
    hold(1, size_t(n) * OC);                                    // dout
    gemm(false, false, tr, IC, r, r, IC);                       // tile += s B[tile] A
    gemm(false, false, n, IC, tr, OC, IC, 0, 0, 1, true);       // dinp += dout[:, tile] tile
    gemm(false, true, n, r, IC, IC, IC, 0, 0, 1, true);         // u = inp A^T
    gemm(true, false, OC, r, n, OC, r, 0, 0, 1, true);          // dB += s dout^T u
    gemm(false, false, n, r, OC, OC, r, 0, 0, 1, true);         // du = s dout B
    gemm(true, false, r, IC, n, r, IC, 0, 0, 1, false, true);   // dA += du^T inp
  };
  const bool lora = o.lora.enabled;
  const int tiles = qtile_rows(o);
  linear(N, C, 3 * C, lora && o.lora.targets.has(LinearSlot::qkv), tiles);
  linear(N, C, C, lora && o.lora.targets.has(LinearSlot::attn_out), tiles);
  linear(N, C, 4 * C, lora && o.lora.targets.has(LinearSlot::mlp_up), tiles);
  linear(N, 4 * C, C, lora && o.lora.targets.has(LinearSlot::mlp_down), tiles);
  // The classifier, a chunk of rows at a time (tied to wte, no adapter).
  // Its weight (wte, or all of it dequantized at once under LoRA) is held
  // rounded for the chunks (Kernels::hold_rounded, GPT::classifier_weight):
  // one copy of this rank's part beside the buffer, none per GEMM. A
  // quantized wte multiplied tile by tile has its tiles rounded per GEMM.
  const int n_cls = classifier_rows(m, shard, o, size_t(N));
  if (!lora || o.whole_classifier_tile) {
    hold(0, static_cast<size_t>(Vp / shard.tp_size) * C);
    most = std::max(most, ops::gemm_16bit_copies_bytes(size_t(n_cls) * C, 0));  // logits = x w^T
    // dx = dlogits w, and (full training) dwte += dlogits^T x on the same copy of dlogits
    most = std::max(most, ops::gemm_16bit_copies_bytes(size_t(n_cls) * Vp, 0,
                                                       lora ? 0 : size_t(n_cls) * C));
  } else {
    linear(n_cls, C, Vp, false, tiles);
  }
  // Flash attention (cuda/flash_attention.cu) rounds qkv(N, 3C) into the
  // same buffer, and dout(N, C) beside it in the backward.
  if (o.attention == Attention::flash)
    most = std::max(most, ops::gemm_16bit_copies_bytes(size_t(N) * 3 * C, size_t(N) * C));
  // Attention keeping the probabilities (cuda/attention.cu), one sequence
  // at a time, strided-batched over the heads.
  if (o.attention == Attention::probabilities) {
    const long long TT = static_cast<long long>(T) * T;
    gemm(false, true, T, T, HS, 3 * C, 3 * C, HS, HS, NH);   // S = Q K^T
    gemm(false, false, T, HS, T, T, 3 * C, TT, HS, NH);      // Y = P V
    gemm(false, true, T, T, HS, C, 3 * C, HS, HS, NH);       // dP = dY V^T
    gemm(true, false, T, HS, T, T, C, TT, HS, NH);           // dV += P^T dY
    gemm(false, false, T, HS, T, T, 3 * C, TT, HS, NH);      // dQ += dS K
    gemm(true, false, T, HS, T, T, 3 * C, TT, HS, NH);       // dK += dS^T Q
  }
  return most + held[0] + held[1];
}

size_t gpu_reduction_scratch_bytes(const GPTConfig& m, const ModelShard& shard, const GPTOptions& o,
                                   int B, int T) {
  if (o.lora.enabled) return 0;  // no bias, LayerNorm or embedding gradient
  const long long N = static_cast<long long>(B) * T;
  const size_t C = static_cast<size_t>(m.n_embd);
  // Columns per call: LayerNorm's dw and db (2C together), the biases of
  // c_attn (3C / tp), c_proj (C), c_fc (4C / tp) and the MLP's c_proj (C).
  const size_t tp = static_cast<size_t>(shard.tp_size);
  size_t bytes = ops::column_partials_bytes(N, std::max(2 * C, 4 * C / tp));
  if (shard.first_stage) bytes += ops::embedding_index_bytes(N);
  return bytes;
}

size_t gpu_norm_scratch_bytes(const std::vector<ParamSpec>& trained) {
  // Kernels::sums_of_squares on a GPU: one double per tensor and one per
  // block of kSumOfSquaresBlock elements of it.
  size_t doubles = 0;
  for (const ParamSpec& p : trained)
    doubles += 1 + (p.numel() + ops::kSumOfSquaresBlock - 1) / ops::kSumOfSquaresBlock;
  return doubles * sizeof(double);
}

size_t gpu_step_workspace_bytes(const GPTConfig& m, const ModelShard& shard, const GPTOptions& o,
                                ops::Precision p, int B, int T) {
  return gpu_gemm_copies_bytes(m, shard, o, p, B, T) +
         gpu_reduction_scratch_bytes(m, shard, o, B, T) +
         gpu_norm_scratch_bytes(trainable_table(m, shard, o)) + ops::kUploadStagingBytes;
}

}  // namespace meshlm
