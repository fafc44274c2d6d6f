// GPT: the forward and backward of one transformer block and of one
// pipeline stage's shard for one micro-batch.
#include <algorithm>

#include "core/error.h"
#include "model/gpt.h"

namespace meshlm {

namespace {
void check_ids(const int32_t* ids, int N, int V, const char* what) {
  for (int i = 0; i < N; ++i) {
    if (ids[i] < 0 || ids[i] >= V)
      throw RankError(std::string(what) + " id " + std::to_string(ids[i]) +
                          " out of range [0, model.vocab_size=" + std::to_string(V) +
                          ") at position " + std::to_string(i) + " of the micro-batch",
                      MESHLM_HERE);
  }
}
}  // namespace

// One transformer block (Megatron tensor parallelism):
//   attention: Y = X A, A split along its columns (heads) across the TP group;
//              Z = Y B, B split along its rows, summed over the group.
//   MLP:       the same with c_fc (columns) and c_proj (rows).
// The sums are the only communication of a block's forward; the biases of the
// row-parallel layers are added once, after the sum.
void GPT::block_forward(int l, const BlockTensors& w, BlockActs& a, const float* x, int B, int Tn) {
  const int tp = shard_.tp_size, C = cfg_.n_embd, Cl = C / tp, NHl = cfg_.n_head / tp;
  const int Fl = 4 * C / tp, N = B * Tn;
  const size_t NC = static_cast<size_t>(N) * C;
  const bool split = tp > 1;
  k_->layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1w, w.ln1b, N, C);
  tp_.copy_to_region_forward(a.ln1, NC);
  linear_forward(l, LinearSlot::qkv, a.qkv, a.ln1, w.qkvw, w.qkvb, N, C, 3 * Cl);
  if (opts_.attention == Attention::flash)
    k_->flash_attention_forward(a.atty, a.att, a.qkv, B, Tn, Cl, NHl);
  else
    k_->attention_forward(a.atty, a.att, a.qkv, B, Tn, Cl, NHl);
  linear_forward(l, LinearSlot::attn_out, a.attproj, a.atty, w.attprojw, split ? nullptr : w.attprojb, N, Cl, C);
  if (split) {
    tp_.reduce_from_region_forward(a.attproj, NC);
    k_->add_bias(a.attproj, w.attprojb, N, C);
  }
  k_->residual_layernorm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, a.attproj, w.ln2w,
                                 w.ln2b, N, C);
  tp_.copy_to_region_forward(a.ln2, NC);
  linear_forward(l, LinearSlot::mlp_up, a.fch, a.ln2, w.fcw, w.fcb, N, C, Fl);
  k_->gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * Fl);
  linear_forward(l, LinearSlot::mlp_down, a.fcproj, a.fch_gelu, w.fcprojw, split ? nullptr : w.fcprojb, N, Fl, C);
  if (split) {
    tp_.reduce_from_region_forward(a.fcproj, NC);
    k_->add_bias(a.fcproj, w.fcprojb, N, C);
  }
  k_->residual_forward(a.res3, a.res2, a.fcproj, NC);
}

// With whole_classifier_tile and a quantized wte: this rank's vocabulary part
// of wte dequantized into the tile buffer, for the head_logits and
// head_backward_rows calls that follow (nothing else uses the buffer between).
void GPT::classifier_tile() {
  if (!opts_.whole_classifier_tile) return;
  const quant::QSlice* q = qbase(idx_cls_);
  if (q == nullptr) return;
  MESHLM_CHECK(q->local_rows() == cfg_.padded_vocab_size() / shard_.tp_size,
               "the quantized wte is not this rank's vocabulary part");
  dq_->rows(*q, 0, q->local_rows(), gacts_.qtile);
}

// The weight the classifier's GEMMs read: wte, or with whole_classifier_tile
// its dequantized copy in the tile buffer; null where a quantized wte is
// multiplied a tile at a time. The chunk loops hold it rounded
// (Kernels::hold_rounded): one copy for all of their GEMMs.
const float* GPT::classifier_weight(const GPTTensors& p) const {
  if (qbase(idx_cls_) == nullptr) return p.cls;
  return opts_.whole_classifier_tile ? gacts_.qtile : nullptr;
}

// The classifier, rows [r0, r0 + nr) of the micro-batch into gacts_.logits:
// lm_head tied to wte, vocabulary-parallel, logits(nr, Vl) = lnf(nr, C) wte_part(Vl, C)^T.
void GPT::head_logits(const SlotActs& s, const GPTTensors& p, int r0, int nr) {
  const int C = cfg_.n_embd, Vl = cfg_.padded_vocab_size() / shard_.tp_size;
  const float* x = s.lnf + static_cast<size_t>(r0) * C;
  if (opts_.whole_classifier_tile && qbase(idx_cls_))  // dequantized by classifier_tile()
    k_->matmul_forward(gacts_.logits, x, gacts_.qtile, nullptr, nr, C, Vl);
  else if (const quant::QSlice* q = qbase(idx_cls_))
    quant::qlinear_forward(*k_, *dq_, gacts_.logits, x, *q, nullptr, nr, gacts_.qtile,
                           qtile_rows(opts_));
  else
    k_->matmul_forward(gacts_.logits, x, p.cls, nullptr, nr, C, Vl);
}

// The classifier's backward on the same rows, once their logits are in
// gacts_.logits and the softmax's reductions in s: dlogits in place, then
// these rows of dlnf = dlogits wte_part (overwritten; this rank's part,
// summed over TP in backward) and dwte_part += dlogits^T lnf.
void GPT::head_backward_rows(SlotActs& s, const GPTTensors& p, int r0, int nr) {
  const int V = cfg_.vocab_size, Vl = cfg_.padded_vocab_size() / shard_.tp_size;
  const int v0 = shard_.tp_rank * Vl;
  k_->xent_local_backward(gacts_.logits, s.xent_max + r0, s.xent_sums + 2 * static_cast<size_t>(r0),
                          gacts_.dlosses + r0, s.targets + r0, nr, Vl, v0, V);
  head_dlogits_backward(s, p, r0, nr);
}

// The same rows once gacts_.logits holds their dlogits: dlnf's rows and dwte.
void GPT::head_dlogits_backward(SlotActs& s, const GPTTensors& p, int r0, int nr) {
  const int C = cfg_.n_embd, Vl = cfg_.padded_vocab_size() / shard_.tp_size;
  float* dx = s.dlnf + static_cast<size_t>(r0) * C;
  if (opts_.whole_classifier_tile && qbase(idx_cls_))
    k_->matmul_backward(dx, nullptr, nullptr, gacts_.logits, nullptr, gacts_.qtile, nr, C, Vl);
  else if (const quant::QSlice* q = qbase(idx_cls_))
    quant::qlinear_backward_input(*k_, *dq_, dx, gacts_.logits, *q, nr, gacts_.qtile,
                                  qtile_rows(opts_));
  else
    k_->matmul_backward(dx, cls_in_blocks() ? nullptr : grad_at(idx_cls_), nullptr, gacts_.logits,
                        s.lnf + static_cast<size_t>(r0) * C, p.cls, nr, C, Vl);
}

// Each block of rows [r0, r0 + n) of this rank's vocabulary part in turn:
// the block buffer zeroed, make(r0, n) fills it, then it is handed on.
template <typename F>
void GPT::for_each_wte_grad_block(int N, F make) {
  const int C = cfg_.n_embd, Vl = cfg_.padded_vocab_size() / shard_.tp_size;
  const int rows = std::min(wte_block_rows_, wte_grad_rows(cfg_, shard_, opts_, N));
  for (int r0 = 0; r0 < Vl; r0 += rows) {
    const int n = std::min(rows, Vl - r0);
    k_->zero(wte_block_, static_cast<size_t>(n) * C);
    make(r0, n);
    wte_block_done_(r0, n);
  }
}

// wte's gradient from the classifier in blocks of vocabulary rows (after the
// row chunks, whose softmax reductions s keeps): logits(N, n) = lnf wte[r0:r0+n]^T
// again, dlogits in place, dwte[r0:r0+n] = dlogits^T lnf.
void GPT::head_wte_grad_blocks(const SlotActs& s, const GPTTensors& p, int N) {
  const int C = cfg_.n_embd, V = cfg_.vocab_size, Vl = cfg_.padded_vocab_size() / shard_.tp_size;
  const int v0 = shard_.tp_rank * Vl;
  const int rows = std::min(wte_block_rows_, wte_grad_rows(cfg_, shard_, opts_, N));
  MESHLM_CHECK(static_cast<size_t>(N) * rows <=
                   static_cast<size_t>(classifier_rows(cfg_, shard_, opts_, N)) * Vl,
               "the classifier's logits buffer is too small for a block of wte's gradient");
  for_each_wte_grad_block(N, [&](int r0, int n) {
    const float* w = p.wte + static_cast<size_t>(r0) * C;
    k_->matmul_forward(gacts_.logits, s.lnf, w, nullptr, N, C, n);
    k_->xent_local_backward(gacts_.logits, s.xent_max, s.xent_sums, gacts_.dlosses, s.targets, N,
                            n, v0 + r0, V);
    k_->matmul_backward(nullptr, wte_block_, nullptr, gacts_.logits, s.lnf, w, N, C, n);
  });
}

// wte's gradient from the lookup in the same blocks: the rows of the tokens
// that fall in each block.
void GPT::embedding_grad_blocks(const SlotActs& s, int N) {
  const int C = cfg_.n_embd, v0 = shard_.tp_rank * (cfg_.padded_vocab_size() / shard_.tp_size);
  for_each_wte_grad_block(N, [&](int r0, int n) {
    k_->embedding_backward(wte_block_, gacts_.dres, s.tokens, N, C, v0 + r0, n);
  });
}

float GPT::forward(int slot, const int32_t* tokens, const int32_t* targets, int B, int Tn,
                   std::optional<float> head_grad_scale) {
  forward_queued(slot, 0, tokens, targets, B, Tn, head_grad_scale);
  return shard_.last_stage ? queued_losses(1)[0] : 0.0f;
}

std::vector<float> GPT::queued_losses(int n) const {
  MESHLM_CHECK(shard_.last_stage && n >= 0 && n <= std::max(opts_.micro_batches, 1) &&
                   gacts_.loss_means != nullptr,
               "queued_losses: not the last stage, no forward yet, or more micro-batches than "
               "options().micro_batches");
  std::vector<float> out(static_cast<size_t>(n));
  k_->download(out.data(), gacts_.loss_means, out.size() * sizeof(float));
  return out;
}

void GPT::forward_queued(int slot, int micro, const int32_t* tokens, const int32_t* targets, int B,
                         int Tn, std::optional<float> head_grad_scale) {
  ensure_activations(B, Tn);
  MESHLM_CHECK(micro >= 0 && micro < std::max(opts_.micro_batches, 1),
               "forward_queued: micro-batch " + std::to_string(micro) + " of " +
                   std::to_string(opts_.micro_batches));
  MESHLM_CHECK(slot >= 0 && slot < opts_.slots, "activation slot out of range");
  SlotActs& s = slots_[slot];
  const int C = cfg_.n_embd, V = cfg_.vocab_size, tp = shard_.tp_size;
  const int Vl = cfg_.padded_vocab_size() / tp, v0 = shard_.tp_rank * Vl, N = B * Tn;
  const GPTTensors p = tensors(params());
  if (shard_.first_stage) {
    check_ids(tokens, N, V, "token");
    k_->upload(s.tokens, tokens, static_cast<size_t>(N) * sizeof(int32_t));
    // Vocabulary-parallel lookup: each rank contributes the rows it holds.
    if (const quant::QSlice* q = qbase(idx_wte_)) {
      dq_->lookup(s.input, s.tokens, N, *q, v0);
    } else {
      k_->embedding_forward(s.input, s.tokens, p.wte, N, C, v0, Vl);
    }
    tp_.reduce_from_region_forward(s.input, static_cast<size_t>(N) * C);
    if (llama_) {
      // No position table: the rotary embeddings turn q and k in each block.
    } else if (const quant::QSlice* q = qbase(idx_wpe_)) {
      dq_->rows(*q, 0, Tn, gacts_.wpe_rows);
      k_->position_forward(s.input, static_cast<const float*>(gacts_.wpe_rows), B, Tn, C);
    } else {
      k_->position_forward(s.input, p.wpe, B, Tn, C);
    }
  }
  const float* x = s.input;
  for (int l = 0; l < n_local_; ++l) {
    if (llama_)
      llama_block_forward(l, p.blocks[l], s.blocks[l], x, B, Tn);
    else
      block_forward(l, p.blocks[l], s.blocks[l], x, B, Tn);
    x = s.blocks[l].res3;
  }
  s.forwarded = true;
  if (!shard_.last_stage) return;

  check_ids(targets, N, V, "target");
  k_->upload(s.targets, targets, static_cast<size_t>(N) * sizeof(int32_t));
  if (llama_)
    k_->rmsnorm_forward(s.lnf, s.lnf_rstd, x, p.lnfw, N, C, cfg_.norm_eps);
  else
    k_->layernorm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, x, p.lnfw, p.lnfb, N, C);
  tp_.copy_to_region_forward(s.lnf, static_cast<size_t>(N) * C);
  // The classifier a chunk of rows at a time; the softmax of each row is
  // assembled from two small reductions over TP, never from all logits.
  // With head_grad_scale, each chunk's backward follows at once, while its
  // logits are at hand.
  s.head_scale = head_grad_scale;
  if (head_grad_scale) {
    k_->fill(gacts_.dlosses, *head_grad_scale / static_cast<float>(N), N);
  }
  const int rows = classifier_rows(cfg_, shard_, opts_, N);
  classifier_tile();
  const ops::HeldRounded held(*k_, classifier_weight(p), static_cast<size_t>(Vl) * C);
  for (int r0 = 0; r0 < N; r0 += rows) {
    const int nr = std::min(rows, N - r0);
    float* rmax = s.xent_max + r0;
    float* sums = s.xent_sums + 2 * static_cast<size_t>(r0);
    head_logits(s, p, r0, nr);
    if (tp == 1) {  // every column here: the max, the sums and the gradient in one op
      k_->xent_rows(gacts_.logits, rmax, sums, head_grad_scale ? gacts_.dlosses + r0 : nullptr,
                    s.targets + r0, nr, Vl, V);
      if (head_grad_scale) head_dlogits_backward(s, p, r0, nr);
      continue;
    }
    k_->xent_local_max(rmax, gacts_.logits, nr, Vl, v0, V);
    tp_.max_over_region(rmax, nr);
    k_->xent_local_sums(sums, gacts_.logits, rmax, s.targets + r0, nr, Vl, v0, V);
    tp_.sum_over_region(sums, 2 * static_cast<size_t>(nr));
    if (head_grad_scale) head_backward_rows(s, p, r0, nr);
  }
  if (head_grad_scale && cls_in_blocks()) head_wte_grad_blocks(s, p, N);
  k_->xent_losses(s.losses, s.xent_max, s.xent_sums, N);
  k_->mean(gacts_.loss_means + micro, s.losses, static_cast<size_t>(N));
}

// The backward of one GPT-2 block, its forward's activations in `a` (recomputed
// under full checkpointing): gacts_.dres holds d loss / d res3 and leaves with
// d loss / d x; the parameter gradients accumulate into gw.
void GPT::gpt2_block_backward(int l, const BlockTensors& w, const BlockTensors& gw, BlockActs& a,
                              const float* x, int B, int Tn) {
  const int tp = shard_.tp_size, C = cfg_.n_embd, Cl = C / tp, NHl = cfg_.n_head / tp;
  const int Fl = 4 * C / tp, N = B * Tn;
  const size_t NC = static_cast<size_t>(N) * C;
  // MLP branch: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2))))
  tp_.reduce_from_region_backward(gacts_.dres, NC);
  linear_backward(l, LinearSlot::mlp_down, gacts_.dfch_gelu, gw.fcprojw, gw.fcprojb, gacts_.dres, a.fch_gelu,
                  w.fcprojw, N, Fl, C);
  k_->gelu_backward(gacts_.dfch, a.fch, gacts_.dfch_gelu, static_cast<size_t>(N) * Fl);
  linear_backward(l, LinearSlot::mlp_up, gacts_.dln, gw.fcw, gw.fcb, gacts_.dfch, a.ln2, w.fcw, N, C, Fl);
  tp_.copy_to_region_backward(gacts_.dln, NC);
  k_->layernorm_backward(gacts_.dres, gw.ln2w, gw.ln2b, gacts_.dln, a.res2, w.ln2w, a.ln2_mean,
                          a.ln2_rstd, N, C);

  // Attention branch: res2 = x + c_proj(attn(c_attn(ln_1(x))))
  tp_.reduce_from_region_backward(gacts_.dres, NC);
  linear_backward(l, LinearSlot::attn_out, gacts_.datty, gw.attprojw, gw.attprojb, gacts_.dres, a.atty,
                  w.attprojw, N, Cl, C);
  if (opts_.attention == Attention::flash)
    k_->flash_attention_backward(gacts_.dqkv, gacts_.datt, gacts_.datty, a.atty, a.qkv, a.att,
                                 B, Tn, Cl, NHl);
  else
    k_->attention_backward(gacts_.dqkv, gacts_.datt, gacts_.datty, a.qkv, a.att, B, Tn, Cl, NHl);
  linear_backward(l, LinearSlot::qkv, gacts_.dln, gw.qkvw, gw.qkvb, gacts_.dqkv, a.ln1, w.qkvw, N, C, 3 * Cl);
  tp_.copy_to_region_backward(gacts_.dln, NC);
  k_->layernorm_backward(gacts_.dres, gw.ln1w, gw.ln1b, gacts_.dln, x, w.ln1w, a.ln1_mean,
                          a.ln1_rstd, N, C);
}

void GPT::backward(int slot, float loss_scale) {
  MESHLM_CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()), "activation slot out of range");
  SlotActs& s = slots_[slot];
  MESHLM_CHECK(s.forwarded, "backward() needs a forward() of its own first");
  const int B = B_, Tn = T_, tp = shard_.tp_size;
  const int C = cfg_.n_embd;
  const int Vl = cfg_.padded_vocab_size() / tp, v0 = shard_.tp_rank * Vl;
  const int N = B * Tn;
  const size_t NC = static_cast<size_t>(N) * C;
  const GPTTensors p = tensors(params());
  // Gradients of base tensors: none when the base is frozen (LoRA).
  const bool frozen = opts_.lora.enabled;
  auto gat = [&](size_t i) { return frozen ? nullptr : grad_at(i); };
  const bool full = opts_.checkpointing == Checkpointing::full;

  if (shard_.last_stage) {
    // Loss = loss_scale * mean_n losses[n]. The classifier's backward ran in
    // forward (at this scale), or runs now, recomputing each chunk's logits.
    if (s.head_scale) {
      MESHLM_CHECK(*s.head_scale == loss_scale,
                   "backward() at loss scale " + std::to_string(loss_scale) +
                       " after a forward() that ran the classifier's backward at " +
                       std::to_string(*s.head_scale));
    } else {
      k_->fill(gacts_.dlosses, loss_scale / static_cast<float>(N), N);
      const int rows = classifier_rows(cfg_, shard_, opts_, N);
      classifier_tile();
      const ops::HeldRounded held(*k_, classifier_weight(p), static_cast<size_t>(Vl) * C);
      for (int r0 = 0; r0 < N; r0 += rows) {
        const int nr = std::min(rows, N - r0);
        head_logits(s, p, r0, nr);
        head_backward_rows(s, p, r0, nr);
      }
      if (cls_in_blocks()) head_wte_grad_blocks(s, p, N);
    }
    // dlnf summed over TP (each rank has its vocabulary part's)
    tp_.copy_to_region_backward(s.dlnf, NC);
    k_->zero(gacts_.dres, NC);
    if (llama_)
      k_->rmsnorm_backward(gacts_.dres, gat(idx_lnfw_), s.dlnf, stage_output(slot), p.lnfw,
                           s.lnf_rstd, N, C);
    else
      k_->layernorm_backward(gacts_.dres, gat(idx_lnfw_), gat(idx_lnfb_), s.dlnf,
                              stage_output(slot), p.lnfw, s.lnf_mean, s.lnf_rstd, N, C);
  }
  // dres holds d loss / d (output of block l); walking down, the residual
  // adds pass it through unchanged and each branch accumulates into it.
  for (int l = n_local_ - 1; l >= 0; --l) {
    const BlockTensors& w = p.blocks[l];
    const BlockTensors gw = block_tensors(l, gat);
    BlockActs& a = s.blocks[l];
    const float* x = (l == 0) ? s.input : s.blocks[l - 1].res3;
    if (llama_) {
      if (full) llama_block_forward(l, w, a, x, B, Tn);  // recompute from the kept input
      llama_block_backward(l, w, gw, a, x, B, Tn);
    } else {
      if (full) block_forward(l, w, a, x, B, Tn);
      gpt2_block_backward(l, w, gw, a, x, B, Tn);
    }
    if (block_done_) block_done_(shard_.layer_begin + l);
  }
  if (shard_.first_stage && !frozen) {
    tp_.reduce_from_region_backward(gacts_.dres, NC);
    if (wte_block_)
      embedding_grad_blocks(s, N);
    else
      k_->embedding_backward(grad_at(idx_wte_), gacts_.dres, s.tokens, N, C, v0, Vl);
    if (!llama_) k_->position_backward(grad_at(idx_wpe_), gacts_.dres, B, Tn, C);
  }
  // dlnf was summed over TP in place: a second backward() needs a new forward().
  s.forwarded = false;
  s.head_scale.reset();
}

}  // namespace meshlm
