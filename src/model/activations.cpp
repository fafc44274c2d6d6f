#include "model/activations.h"

#include <algorithm>
#include <tuple>

#include "core/kept.h"
#include "quant/qlinear.h"

namespace meshlm {

int classifier_rows(const GPTConfig& cfg, const ModelShard& shard, const GPTOptions& opts, size_t N) {
  const size_t Vl = cfg.padded_vocab_size() / shard.tp_size;
  const size_t most = opts.classifier_rows > 0 ? size_t(opts.classifier_rows)
                                               : std::max<size_t>(1, kClassifierChunkFloats / Vl);
  // As few chunks as `most` rows allow, of equal size: no thin last chunk,
  // whose GEMMs would run far below the others' rate (50 of 2048 rows of
  // GPT-2's logits: half the rate).
  const size_t n = std::max<size_t>(N, 1), chunks = (n + most - 1) / most;
  return static_cast<int>((n + chunks - 1) / chunks);
}

int wte_grad_rows(const GPTConfig& cfg, const ModelShard& shard, const GPTOptions& opts, size_t N) {
  const size_t Vl = cfg.padded_vocab_size() / shard.tp_size;
  const size_t logits = size_t(classifier_rows(cfg, shard, opts, N)) * Vl;
  return static_cast<int>(std::clamp<size_t>(logits / std::max<size_t>(N, 1), 1, Vl));
}

int qtile_rows(const GPTOptions& opts) {
  return opts.qtile_rows > 0 ? opts.qtile_rows : quant::kQLinearTileRows;
}

void plan_activations(const GPTConfig& cfg, const ModelShard& shard, const GPTOptions& opts, int B,
                      int Tn, ActLayout& L) {
  const size_t BT = static_cast<size_t>(B) * Tn, C = cfg.n_embd;
  const size_t tp = shard.tp_size, Cl = C / tp, NHl = cfg.n_head / tp;
  const size_t Fl = static_cast<size_t>(cfg.mlp_width()) / tp, Vl = cfg.padded_vocab_size() / tp;
  const bool llama = cfg.arch == ModelArch::llama;
  const size_t HS = static_cast<size_t>(cfg.head_size()),
               Ckvl = static_cast<size_t>(cfg.kv_heads_held(static_cast<int>(tp))) * HS;
  // Replicated key/value heads under tp: their weights' gradients are partial
  // sums on each rank, made apart and summed over the group.
  const bool kv_partial = llama && tp > 1 && !cfg.kv_heads_split(static_cast<int>(tp));
  const int le = shard.layer_end < 0 ? cfg.n_layer : shard.layer_end;
  const int n_local = le - shard.layer_begin;
  const bool full = opts.checkpointing == Checkpointing::full;
  // What attention keeps per row of a head: T probabilities, or one
  // log-sum-exp under flash (and as much backward scratch).
  const size_t att_row = opts.attention == Attention::flash ? 1 : static_cast<size_t>(Tn);
  // The vectors are sized before any pointer into them is recorded. A count
  // alone walks every slot through one slot of its own.
  L.slots.resize(L.count_only ? 1 : static_cast<size_t>(opts.slots));
  for (auto& s : L.slots) s.blocks.assign(n_local, BlockActs{});
  auto cut = [&](float*& p, size_t n, bool grad = false) {
    if (!L.count_only) L.cuts.push_back({&p, n, grad});
    (grad ? L.grad_floats : L.act_floats) += n;
  };
  static_assert(sizeof(int32_t) == sizeof(float));
  auto cut_ids = [&](int32_t*& p, size_t n) {
    if (!L.count_only) L.cuts.push_back({nullptr, n, false, &p});
    L.act_floats += n;
  };
  // Everything of one block but its output (res3).
  auto cut_block_inner = [&](BlockActs& a) {
    cut(a.ln1, BT * C);
    if (!llama) cut(a.ln1_mean, BT);  // RMSNorm keeps no mean
    cut(a.ln1_rstd, BT);
    cut(a.qkv, BT * 3 * Cl);
    cut(a.atty, BT * Cl);
    cut(a.att, BT * NHl * att_row);
    cut(a.attproj, BT * C);
    cut(a.res2, BT * C);
    cut(a.ln2, BT * C);
    if (!llama) cut(a.ln2_mean, BT);
    cut(a.ln2_rstd, BT);
    cut(a.fch, BT * Fl);
    if (llama) cut(a.up, BT * Fl);  // the up projection, beside the gate's (fch)
    cut(a.fch_gelu, BT * Fl);
    cut(a.fcproj, BT * C);
  };
  if (full) cut_block_inner(L.recompute);
  for (int slot = 0; slot < opts.slots; ++slot) {
    SlotActs& s = L.slots[L.count_only ? 0 : static_cast<size_t>(slot)];
    s.tokens = s.targets = nullptr;
    if (shard.first_stage) cut_ids(s.tokens, BT);
    if (shard.last_stage) cut_ids(s.targets, BT);
    cut(s.input, BT * C);
    for (auto& a : s.blocks) {
      if (!full) cut_block_inner(a);
      cut(a.res3, BT * C);
    }
    if (shard.last_stage) {
      cut(s.lnf, BT * C);
      if (!llama) cut(s.lnf_mean, BT);
      cut(s.lnf_rstd, BT);
      cut(s.dlnf, BT * C);
      cut(s.losses, BT);
      cut(s.xent_max, BT);
      cut(s.xent_sums, 2 * BT);
    }
  }
  if (shard.last_stage) cut(L.g.loss_means, static_cast<size_t>(std::max(opts.micro_batches, 1)));
  cut(L.g.dres, BT * C, true);
  cut(L.g.dln, BT * C, true);
  cut(L.g.dqkv, BT * 3 * Cl, true);
  cut(L.g.datty, BT * Cl, true);
  cut(L.g.datt, BT * NHl * att_row, true);
  cut(L.g.dfch, BT * Fl, true);
  cut(L.g.dfch_gelu, BT * Fl, true);
  cut(L.g.dlosses, BT, true);
  if (shard.last_stage) cut(L.g.logits, classifier_rows(cfg, shard, opts, BT) * Vl, true);
  if (llama) {
    cut(L.g.dq, BT * Cl, true);
    cut(L.g.dk, BT * Ckvl, true);
    cut(L.g.dv, BT * Ckvl, true);
    cut(L.g.dup, BT * Fl, true);
    cut(L.g.dln2, BT * C, true);
    cut(L.g.rope_cos, static_cast<size_t>(Tn) * HS / 2);
    cut(L.g.rope_sin, static_cast<size_t>(Tn) * HS / 2);
    if (kv_partial && !opts.lora.enabled) cut(L.g.kv_dw, Ckvl * C, true);
  }
  if (opts.lora.enabled) {
    const size_t r = opts.lora.rank;
    cut(L.g.lora_u, BT * r, true);
    cut(L.g.lora_du, BT * r, true);
    cut(L.g.lora_tmp, r * C + (kv_partial ? r * Ckvl : 0), true);
    const size_t classifier = opts.whole_classifier_tile && shard.last_stage ? Vl * C : 0;
    cut(L.g.qtile, std::max(static_cast<size_t>(qtile_rows(opts)) * std::max(C, Fl), classifier),
        true);
    if (shard.first_stage && !llama) cut(L.g.wpe_rows, static_cast<size_t>(Tn) * C, true);
  }
}

void ActLayout::bind(float* acts, float* grads, Checkpointing checkpointing) {
  size_t a = 0, g = 0;
  for (const Cut& c : cuts) {
    if (c.ids != nullptr)
      *c.ids = reinterpret_cast<int32_t*>(acts + a);  // raw memory, only ever read as ids
    else
      *c.ptr = c.grad ? grads + g : acts + a;
    (c.grad ? g : a) += c.n;
  }
  if (checkpointing == Checkpointing::full) {
    // Checkpointed blocks keep their output only; the rest is recomputed
    // into the one shared block.
    for (auto& s : slots) {
      for (auto& b : s.blocks) {
        float* res3 = b.res3;
        b = recompute;
        b.res3 = res3;
      }
    }
  }
}

size_t activation_bytes(const GPTConfig& cfg, const ModelShard& shard, const GPTOptions& opts,
                        int B, int Tn) {
  // Kept (core/kept.h): the planner asks it for every rank of every layout
  // and candidate pipeline split, the ranks of one shard alike, and a plan
  // of its cuts costs an allocation per tensor of every block and slot.
  thread_local KeptValues<GPTConfig, std::tuple<ModelShard, GPTOptions, int, int>, size_t> kept(
      1 << 16);
  return kept.get(cfg, {shard, opts, B, Tn}, [&] {
    ActLayout L;
    L.count_only = true;
    plan_activations(cfg, shard, opts, B, Tn, L);
    return (L.act_floats + L.grad_floats) * sizeof(float);
  });
}

}  // namespace meshlm
