// GPT: the dispatch of one linear layer of a block — its fp32 weight, or its
// frozen quantized base under LoRA, plus the layer's adapter when it has one.
#include "model/gpt.h"
#include "ops/kernels.h"

namespace meshlm {

// The layer's adapter as the quantized layer merges it into its tiles
// (quant::QAdapter); nullopt when the layer has none.
std::optional<quant::QAdapter> GPT::merged_adapter(int l, LinearSlot slot) const {
  const AdapterIndex ai = adapter_[l][static_cast<int>(slot)];
  if (ai.a < 0) return std::nullopt;
  quant::QAdapter a;
  a.A = params() + table_[ai.a].offset;
  a.B = params() + table_[ai.b].offset;
  a.scale = opts_.lora.scale();
  a.rank = opts_.lora.rank;
  return a;
}

void GPT::linear_forward(int l, LinearSlot slot, float* out, const float* inp, const float* w,
                         const float* bias, int N, int IC, int OC) {
  const int t = static_cast<int>(slot);
  const std::optional<quant::QAdapter> lora = merged_adapter(l, slot);
  if (const quant::QSlice* q = qbase(linear_index_[l][t])) {
    // The adapter rides in the dequantized tiles: one GEMM for both.
    quant::qlinear_forward(*k_, *dq_, out, inp, *q, bias, N, gacts_.qtile, qtile_rows(opts_),
                           lora ? &*lora : nullptr);
    return;
  }
  k_->matmul_forward(out, inp, w, bias, N, IC, OC);
  if (!lora) return;
  // Column-parallel: u = x A^T is whole on every rank, B's rows are this
  // rank's outputs. Row-parallel: u is this rank's partial sum, and so is
  // s u B^T, which the sum over the group completes, like x W^T.
  lora_forward(*k_, out, inp, lora->A, lora->B, lora->scale, N, IC, OC, lora->rank,
               gacts_.lora_u);
}

void GPT::linear_backward(int l, LinearSlot slot, float* dinp, float* dw, float* dbias,
                          const float* dout, const float* inp, const float* w, int N, int IC,
                          int OC) {
  const int t = static_cast<int>(slot);
  const std::optional<quant::QAdapter> lora = merged_adapter(l, slot);
  const quant::QSlice* q = qbase(linear_index_[l][t]);
  // With an adapter, inp and dout feed several GEMMs each (the base's input
  // gradient, the adapter's four products): rounded once for all of them.
  const ops::HeldRounded held_inp(*k_, lora ? inp : nullptr, static_cast<size_t>(N) * IC);
  const ops::HeldRounded held_dout(*k_, lora ? dout : nullptr, static_cast<size_t>(N) * OC);
  const bool split = shard_.tp_size > 1;
  if (q) {
    // Frozen: no dW, no dbias; dinp through the base and the merged adapter.
    quant::qlinear_backward_input(*k_, *dq_, dinp, dout, *q, N, gacts_.qtile, qtile_rows(opts_),
                                  lora ? &*lora : nullptr);
  } else if (split && dw != nullptr && table_[linear_index_[l][t]].tp_dim < 0) {
    // A weight every TP rank holds whole whose output gradient each rank has
    // only in part (Llama's replicated key/value heads: each rank's query
    // heads' share): its gradient made apart, summed over the group, added.
    MESHLM_CHECK(dbias == nullptr && gacts_.kv_dw != nullptr,
                 "a replicated linear layer's partial gradient needs its scratch");
    const size_t n = static_cast<size_t>(OC) * IC;
    k_->zero(gacts_.kv_dw, n);
    k_->matmul_backward(dinp, gacts_.kv_dw, nullptr, dout, inp, w, N, IC, OC);
    tp_.sum_over_region(gacts_.kv_dw, n);
    k_->add(dw, gacts_.kv_dw, n);
  } else {
    k_->matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC);
  }
  if (!lora) return;
  const AdapterIndex ai = adapter_[l][t];
  const ParamSpec &sa = table_[ai.a], &sb = table_[ai.b];
  // A replicated factor (A of a column-parallel layer, B of a row-parallel
  // one, both of a replicated layer) gets a partial gradient on each TP rank:
  // computed apart, summed over the group, then accumulated.
  const bool a_partial = split && sa.tp_dim < 0, b_partial = split && sb.tp_dim < 0;
  float* dA = grad_at(ai.a);
  float* dB = grad_at(ai.b);
  float* tmp_a = gacts_.lora_tmp;
  float* tmp_b = gacts_.lora_tmp + (a_partial ? sa.numel() : 0);
  if (a_partial) k_->zero(tmp_a, sa.numel());
  if (b_partial) k_->zero(tmp_b, sb.numel());
  lora_backward(*k_, q ? nullptr : dinp, a_partial ? tmp_a : dA, b_partial ? tmp_b : dB, dout, inp,
                lora->A, lora->B, lora->scale, N, IC, OC, lora->rank, gacts_.lora_u,
                gacts_.lora_du);
  const size_t n = (a_partial ? sa.numel() : 0) + (b_partial ? sb.numel() : 0);
  if (n == 0) return;
  tp_.sum_over_region(gacts_.lora_tmp, n);  // the two factors' in one sum
  if (a_partial) k_->add(dA, tmp_a, sa.numel());
  if (b_partial) k_->add(dB, tmp_b, sb.numel());
}

}  // namespace meshlm
