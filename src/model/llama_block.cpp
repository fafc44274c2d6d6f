// GPT: the forward and backward of one Llama block (model.arch = llama):
//   h   = x + o(attn(rope(q(rms_1(x))), rope(k(rms_1(x))), v(rms_1(x))))
//   out = h + down(silu(gate(rms_2(h))) * up(rms_2(h)))
// with grouped-query attention (each key/value head shared by n_head /
// n_kv_head query heads, packed beside them for the attention ops), no
// biases, RMSNorm in fp32.
//
// Tensor parallelism as GPT-2's (Megatron): q, k, v, gate and up
// column-parallel, o and down row-parallel and summed over the group. Each
// rank has n_head / tp query heads; the key/value heads split the same way
// when n_kv_head is a multiple of tp, else every rank computes them all
// (replicated weights) and reads those its query heads need; their weights'
// gradients are then partial sums, summed over the group (linear_backward).
#include "core/error.h"
#include "model/gpt.h"

namespace meshlm {

namespace {

// This rank's heads and how its query heads read the key/value heads it holds.
struct LlamaHeads {
  int NHl, NKVh, Cl, Ckv, Fl;
  ops::GqaMap map;
};

LlamaHeads heads_of(const GPTConfig& cfg, const ModelShard& shard) {
  const int tp = shard.tp_size, HS = cfg.head_size();
  LlamaHeads h;
  h.NHl = cfg.n_head / tp;
  h.NKVh = cfg.kv_heads_held(tp);
  h.Cl = h.NHl * HS;
  h.Ckv = h.NKVh * HS;
  h.Fl = cfg.mlp_width() / tp;
  if (!cfg.kv_heads_split(tp)) h.map = {shard.tp_rank * h.NHl, cfg.n_head / cfg.kv_heads()};
  return h;
}

}  // namespace

void GPT::llama_block_forward(int l, const BlockTensors& w, BlockActs& a, const float* x, int B,
                              int Tn) {
  const int C = cfg_.n_embd, HS = cfg_.head_size(), N = B * Tn;
  const LlamaHeads h = heads_of(cfg_, shard_);
  const size_t NC = static_cast<size_t>(N) * C;
  const double eps = cfg_.norm_eps;
  // Attention. q, k and v in the gradient scratch (free in a forward), turned
  // by the rotary embeddings, then packed with the key/value heads repeated.
  k_->rmsnorm_forward(a.ln1, a.ln1_rstd, x, w.ln1w, N, C, eps);
  tp_.copy_to_region_forward(a.ln1, NC);
  float *q = gacts_.dq, *kk = gacts_.dk, *v = gacts_.dv;
  linear_forward(l, LinearSlot::q, q, a.ln1, w.qw, nullptr, N, C, h.Cl);
  linear_forward(l, LinearSlot::k, kk, a.ln1, w.kw, nullptr, N, C, h.Ckv);
  linear_forward(l, LinearSlot::v, v, a.ln1, w.vw, nullptr, N, C, h.Ckv);
  k_->rope_forward(q, gacts_.rope_cos, gacts_.rope_sin, B, Tn, h.NHl, HS, static_cast<size_t>(h.Cl));
  k_->rope_forward(kk, gacts_.rope_cos, gacts_.rope_sin, B, Tn, h.NKVh, HS,
                   static_cast<size_t>(h.Ckv));
  k_->gqa_pack_forward(a.qkv, q, kk, v, N, h.NHl, h.NKVh, HS, h.map);
  if (opts_.attention == Attention::flash)
    k_->flash_attention_forward(a.atty, a.att, a.qkv, B, Tn, h.Cl, h.NHl);
  else
    k_->attention_forward(a.atty, a.att, a.qkv, B, Tn, h.Cl, h.NHl);
  linear_forward(l, LinearSlot::o, a.attproj, a.atty, w.ow, nullptr, N, h.Cl, C);
  tp_.reduce_from_region_forward(a.attproj, NC);
  // The residual add and the SwiGLU MLP's norm in one pass.
  k_->residual_rmsnorm_forward(a.res2, a.ln2, a.ln2_rstd, x, a.attproj, w.ln2w, N, C, eps);
  tp_.copy_to_region_forward(a.ln2, NC);
  linear_forward(l, LinearSlot::gate, a.fch, a.ln2, w.gatew, nullptr, N, C, h.Fl);
  linear_forward(l, LinearSlot::up, a.up, a.ln2, w.upw, nullptr, N, C, h.Fl);
  k_->swiglu_forward(a.fch_gelu, a.fch, a.up, N, h.Fl, static_cast<size_t>(h.Fl));
  linear_forward(l, LinearSlot::down, a.fcproj, a.fch_gelu, w.downw, nullptr, N, h.Fl, C);
  tp_.reduce_from_region_forward(a.fcproj, NC);
  k_->residual_forward(a.res3, a.res2, a.fcproj, NC);
}

// gacts_.dres holds d loss / d out and leaves with d loss / d x; the
// parameter gradients accumulate into gw. Two projections of one input
// (gate and up; q, k and v) each overwrite an input gradient: the second
// goes to gacts_.dln2 and is added.
void GPT::llama_block_backward(int l, const BlockTensors& w, const BlockTensors& gw, BlockActs& a,
                               const float* x, int B, int Tn) {
  const int C = cfg_.n_embd, HS = cfg_.head_size(), N = B * Tn;
  const LlamaHeads h = heads_of(cfg_, shard_);
  const size_t NC = static_cast<size_t>(N) * C;
  GradActs& g = gacts_;
  // MLP branch.
  tp_.reduce_from_region_backward(g.dres, NC);
  linear_backward(l, LinearSlot::down, g.dfch_gelu, gw.downw, nullptr, g.dres, a.fch_gelu, w.downw,
                  N, h.Fl, C);
  k_->swiglu_backward(g.dfch, g.dup, g.dfch_gelu, a.fch, a.up, N, h.Fl, static_cast<size_t>(h.Fl));
  linear_backward(l, LinearSlot::gate, g.dln, gw.gatew, nullptr, g.dfch, a.ln2, w.gatew, N, C, h.Fl);
  linear_backward(l, LinearSlot::up, g.dln2, gw.upw, nullptr, g.dup, a.ln2, w.upw, N, C, h.Fl);
  k_->add(g.dln, g.dln2, NC);
  tp_.copy_to_region_backward(g.dln, NC);
  k_->rmsnorm_backward(g.dres, gw.ln2w, g.dln, a.res2, w.ln2w, a.ln2_rstd, N, C);
  // Attention branch.
  tp_.reduce_from_region_backward(g.dres, NC);
  linear_backward(l, LinearSlot::o, g.datty, gw.ow, nullptr, g.dres, a.atty, w.ow, N, h.Cl, C);
  if (opts_.attention == Attention::flash)
    k_->flash_attention_backward(g.dqkv, g.datt, g.datty, a.atty, a.qkv, a.att, B, Tn, h.Cl, h.NHl);
  else
    k_->attention_backward(g.dqkv, g.datt, g.datty, a.qkv, a.att, B, Tn, h.Cl, h.NHl);
  k_->gqa_pack_backward(g.dq, g.dk, g.dv, g.dqkv, N, h.NHl, h.NKVh, HS, h.map);
  k_->rope_backward(g.dq, g.rope_cos, g.rope_sin, B, Tn, h.NHl, HS, static_cast<size_t>(h.Cl));
  k_->rope_backward(g.dk, g.rope_cos, g.rope_sin, B, Tn, h.NKVh, HS, static_cast<size_t>(h.Ckv));
  linear_backward(l, LinearSlot::q, g.dln, gw.qw, nullptr, g.dq, a.ln1, w.qw, N, C, h.Cl);
  linear_backward(l, LinearSlot::k, g.dln2, gw.kw, nullptr, g.dk, a.ln1, w.kw, N, C, h.Ckv);
  k_->add(g.dln, g.dln2, NC);
  linear_backward(l, LinearSlot::v, g.dln2, gw.vw, nullptr, g.dv, a.ln1, w.vw, N, C, h.Ckv);
  k_->add(g.dln, g.dln2, NC);
  tp_.copy_to_region_backward(g.dln, NC);
  k_->rmsnorm_backward(g.dres, gw.ln1w, g.dln, x, w.ln1w, a.ln1_rstd, N, C);
}

}  // namespace meshlm
