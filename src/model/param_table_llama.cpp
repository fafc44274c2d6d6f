// The Llama family's parameter table (model/param_table.h).
#include "core/error.h"
#include "core/kept.h"
#include "model/param_table.h"

namespace meshlm {

std::vector<ParamSpec> llama_param_table(const GPTConfig& cfg, const ModelShard& shard) {
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab_size(), HS = cfg.head_size();
  const int64_t Ckv = static_cast<int64_t>(cfg.kv_heads()) * HS, F = cfg.mlp_width();
  const int tp = shard.tp_size;
  const int lb = shard.layer_begin, le = shard.layer_end < 0 ? cfg.n_layer : shard.layer_end;
  MESHLM_CHECK(cfg.arch == ModelArch::llama, "llama_param_table of a model that is not Llama");
  MESHLM_CHECK(tp >= 1 && shard.tp_rank >= 0 && shard.tp_rank < tp, "bad tensor-parallel rank");
  MESHLM_CHECK(0 <= lb && lb <= le && le <= cfg.n_layer, "bad layer range");
  const bool first = shard.first_stage, last = shard.last_stage, tied = cfg.tie_word_embeddings;
  // Key/value heads split like the query heads when every rank gets whole
  // ones; fewer than tp are held whole by every rank.
  const int kv_dim = cfg.kv_heads_split(tp) ? 0 : -1;
  using R = ParamRole;
  using I = InitKind;
  TableBuilder b(tp);
  b.add({.name = "embed_tokens.weight", .tp_dim = 0, .full_shape = {Vp, C},
         .role = R::token_embedding, .init = I::normal_vocab,
         .tied = tied ? TiedGroup::embedding : TiedGroup::none},
        first || (last && tied));
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string h = "layers." + std::to_string(l) + ".";
    const bool mine = lb <= l && l < le;
    auto norm = [&](const char* n, R role) {
      b.add({.name = h + n + ".weight", .layer = l, .full_shape = {C}, .role = role, .init = I::ones},
            mine);
    };
    auto linear = [&](const char* n, LinearSlot slot, int64_t OC, int64_t IC, int tp_dim) {
      b.add({.name = h + n + ".weight", .tp_dim = tp_dim, .layer = l, .full_shape = {OC, IC},
             .role = R::linear_weight, .slot = slot, .init = I::normal},
            mine);
    };
    norm("input_layernorm", R::ln1_weight);
    linear("self_attn.q_proj", LinearSlot::q, C, C, 0);
    linear("self_attn.k_proj", LinearSlot::k, Ckv, C, kv_dim);
    linear("self_attn.v_proj", LinearSlot::v, Ckv, C, kv_dim);
    linear("self_attn.o_proj", LinearSlot::o, C, C, 1);
    norm("post_attention_layernorm", R::ln2_weight);
    linear("mlp.gate_proj", LinearSlot::gate, F, C, 0);
    linear("mlp.up_proj", LinearSlot::up, F, C, 0);
    linear("mlp.down_proj", LinearSlot::down, C, F, 1);
  }
  b.add({.name = "norm.weight", .full_shape = {C}, .role = R::lnf_weight, .init = I::ones}, last);
  if (!tied)
    b.add({.name = "lm_head.weight", .tp_dim = 0, .full_shape = {Vp, C}, .role = R::lm_head,
           .init = I::normal_vocab},
          last);
  return b.take();
}

std::shared_ptr<const std::vector<ParamSpec>> shared_param_table(const GPTConfig& cfg,
                                                                 const ModelShard& shard) {
  thread_local KeptValues<GPTConfig, ModelShard, std::shared_ptr<const std::vector<ParamSpec>>>
      kept(kKeptTables);
  return kept.get(cfg, shard, [&] {
    return std::make_shared<const std::vector<ParamSpec>>(
        cfg.arch == ModelArch::llama ? llama_param_table(cfg, shard) : gpt_param_table(cfg, shard));
  });
}

std::vector<ParamSpec> model_param_table(const GPTConfig& cfg, const ModelShard& shard) {
  return *shared_param_table(cfg, shard);
}

}  // namespace meshlm
