// GPT: the forward and backward of one Llama block (model.arch = llama):
//   h   = x + o(attn(rope(q(rms_1(x))), rope(k(rms_1(x))), v(rms_1(x))))
//   out = h + down(silu(gate(rms_2(h))) * up(rms_2(h)))
// with grouped-query attention (each key/value head shared by n_head /
// n_kv_head query heads, packed beside them for the attention ops), no
// biases, RMSNorm in fp32. One rank holds the block whole (tp = 1).
#include "core/error.h"
#include "model/gpt.h"

namespace meshlm {

void GPT::llama_block_forward(int l, const BlockTensors& w, BlockActs& a, const float* x, int B,
                              int Tn) {
  const int C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.kv_heads(), HS = cfg_.head_size();
  const int Ckv = NKV * HS, F = cfg_.mlp_width(), N = B * Tn;
  const size_t NC = static_cast<size_t>(N) * C;
  const double eps = cfg_.norm_eps;
  // Attention. q, k and v in the gradient scratch (free in a forward), turned
  // by the rotary embeddings, then packed with the key/value heads repeated.
  k_->rmsnorm_forward(a.ln1, a.ln1_rstd, x, w.ln1w, N, C, eps);
  float *q = gacts_.dq, *kk = gacts_.dk, *v = gacts_.dv;
  linear_forward(l, LinearSlot::q, q, a.ln1, w.qw, nullptr, N, C, C);
  linear_forward(l, LinearSlot::k, kk, a.ln1, w.kw, nullptr, N, C, Ckv);
  linear_forward(l, LinearSlot::v, v, a.ln1, w.vw, nullptr, N, C, Ckv);
  k_->rope_forward(q, gacts_.rope_cos, gacts_.rope_sin, B, Tn, NH, HS, static_cast<size_t>(C));
  k_->rope_forward(kk, gacts_.rope_cos, gacts_.rope_sin, B, Tn, NKV, HS, static_cast<size_t>(Ckv));
  k_->gqa_pack_forward(a.qkv, q, kk, v, N, NH, NKV, HS);
  if (opts_.attention == Attention::flash)
    k_->flash_attention_forward(a.atty, a.att, a.qkv, B, Tn, C, NH);
  else
    k_->attention_forward(a.atty, a.att, a.qkv, B, Tn, C, NH);
  linear_forward(l, LinearSlot::o, a.attproj, a.atty, w.ow, nullptr, N, C, C);
  k_->residual_forward(a.res2, x, a.attproj, NC);
  // The SwiGLU MLP.
  k_->rmsnorm_forward(a.ln2, a.ln2_rstd, a.res2, w.ln2w, N, C, eps);
  linear_forward(l, LinearSlot::gate, a.fch, a.ln2, w.gatew, nullptr, N, C, F);
  linear_forward(l, LinearSlot::up, a.up, a.ln2, w.upw, nullptr, N, C, F);
  k_->swiglu_forward(a.fch_gelu, a.fch, a.up, N, F, static_cast<size_t>(F));
  linear_forward(l, LinearSlot::down, a.fcproj, a.fch_gelu, w.downw, nullptr, N, F, C);
  k_->residual_forward(a.res3, a.res2, a.fcproj, NC);
}

// gacts_.dres holds d loss / d out and leaves with d loss / d x; the
// parameter gradients accumulate into gw. Two projections of one input
// (gate and up; q, k and v) each overwrite an input gradient: the second
// goes to gacts_.dln2 and is added.
void GPT::llama_block_backward(int l, const BlockTensors& w, const BlockTensors& gw, BlockActs& a,
                               const float* x, int B, int Tn) {
  const int C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.kv_heads(), HS = cfg_.head_size();
  const int Ckv = NKV * HS, F = cfg_.mlp_width(), N = B * Tn;
  const size_t NC = static_cast<size_t>(N) * C;
  GradActs& g = gacts_;
  // MLP branch.
  linear_backward(l, LinearSlot::down, g.dfch_gelu, gw.downw, nullptr, g.dres, a.fch_gelu, w.downw,
                  N, F, C);
  k_->swiglu_backward(g.dfch, g.dup, g.dfch_gelu, a.fch, a.up, N, F, static_cast<size_t>(F));
  linear_backward(l, LinearSlot::gate, g.dln, gw.gatew, nullptr, g.dfch, a.ln2, w.gatew, N, C, F);
  linear_backward(l, LinearSlot::up, g.dln2, gw.upw, nullptr, g.dup, a.ln2, w.upw, N, C, F);
  k_->add(g.dln, g.dln2, NC);
  k_->rmsnorm_backward(g.dres, gw.ln2w, g.dln, a.res2, w.ln2w, a.ln2_rstd, N, C);
  // Attention branch.
  linear_backward(l, LinearSlot::o, g.datty, gw.ow, nullptr, g.dres, a.atty, w.ow, N, C, C);
  if (opts_.attention == Attention::flash)
    k_->flash_attention_backward(g.dqkv, g.datt, g.datty, a.atty, a.qkv, a.att, B, Tn, C, NH);
  else
    k_->attention_backward(g.dqkv, g.datt, g.datty, a.qkv, a.att, B, Tn, C, NH);
  k_->gqa_pack_backward(g.dq, g.dk, g.dv, g.dqkv, N, NH, NKV, HS);
  k_->rope_backward(g.dq, g.rope_cos, g.rope_sin, B, Tn, NH, HS, static_cast<size_t>(C));
  k_->rope_backward(g.dk, g.rope_cos, g.rope_sin, B, Tn, NKV, HS, static_cast<size_t>(Ckv));
  linear_backward(l, LinearSlot::q, g.dln, gw.qw, nullptr, g.dq, a.ln1, w.qw, N, C, C);
  linear_backward(l, LinearSlot::k, g.dln2, gw.kw, nullptr, g.dk, a.ln1, w.kw, N, C, Ckv);
  k_->add(g.dln, g.dln2, NC);
  linear_backward(l, LinearSlot::v, g.dln2, gw.vw, nullptr, g.dv, a.ln1, w.vw, N, C, Ckv);
  k_->add(g.dln, g.dln2, NC);
  k_->rmsnorm_backward(g.dres, gw.ln1w, g.dln, x, w.ln1w, a.ln1_rstd, N, C);
}

}  // namespace meshlm
