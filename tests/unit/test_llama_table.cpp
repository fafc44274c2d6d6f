// The Llama family's configuration and parameter table (model/param_table.h,
// llama_param_table): the parameter counts of published models, Hugging
// Face's tensor names and shapes, the tensor-parallel split (key/value heads
// replicated when fewer than tp), the pipeline stages (the embedding tied or
// not), and the configuration's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "core/error.h"
#include "model/gpt.h"
#include "model/param_table.h"

using namespace meshlm;

namespace {

GPTConfig llama(int L, int NH, int C, int V, int NKV, int F, bool tied) {
  GPTConfig c;
  c.arch = ModelArch::llama;
  c.n_layer = L;
  c.n_head = NH;
  c.n_embd = C;
  c.vocab_size = V;
  c.max_seq_len = 8192;
  c.n_kv_head = NKV;
  c.intermediate_size = F;
  c.tie_word_embeddings = tied;
  return c;
}

std::map<std::string, ParamSpec> by_name(const std::vector<ParamSpec>& t) {
  std::map<std::string, ParamSpec> m;
  for (const ParamSpec& p : t) m[p.name] = p;
  return m;
}

}  // namespace

// The parameter counts their model cards give (no vocabulary padding: each
// vocabulary is a multiple of 64).
TEST(LlamaTable, ParameterCountsOfPublishedModels) {
  // Llama 3 8B: untied, grouped-query attention (8 of 32 heads).
  EXPECT_EQ(table_numel(llama_param_table(llama(32, 32, 4096, 128256, 8, 14336, false))),
            8030261248u);
  // TinyLlama 1.1B: untied, 4 key/value heads.
  EXPECT_EQ(table_numel(llama_param_table(llama(22, 32, 2048, 32000, 4, 5632, false))),
            1100048384u);
  // Llama 3.2 1B: the classifier tied to the embedding.
  EXPECT_EQ(table_numel(llama_param_table(llama(16, 32, 2048, 128256, 8, 8192, true))),
            1235814400u);
}

TEST(LlamaTable, HuggingFaceNamesShapesAndRoles) {
  const GPTConfig c = llama(2, 8, 64, 250, 2, 96, false);
  const std::vector<ParamSpec> t = llama_param_table(c);
  const auto m = by_name(t);
  ASSERT_EQ(t.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(t.front().name, "embed_tokens.weight");
  EXPECT_EQ(t.back().name, "lm_head.weight");
  EXPECT_EQ(m.at("embed_tokens.weight").full_shape, (Shape{256, 64}));  // padded to 64
  EXPECT_EQ(m.at("lm_head.weight").full_shape, (Shape{256, 64}));
  EXPECT_EQ(m.at("lm_head.weight").role, ParamRole::lm_head);
  EXPECT_EQ(m.at("lm_head.weight").tied, TiedGroup::none);
  EXPECT_EQ(m.at("layers.1.self_attn.q_proj.weight").full_shape, (Shape{64, 64}));
  EXPECT_EQ(m.at("layers.1.self_attn.k_proj.weight").full_shape, (Shape{16, 64}));  // 2 heads of 8
  EXPECT_EQ(m.at("layers.1.self_attn.v_proj.weight").full_shape, (Shape{16, 64}));
  EXPECT_EQ(m.at("layers.1.self_attn.o_proj.weight").full_shape, (Shape{64, 64}));
  EXPECT_EQ(m.at("layers.1.mlp.gate_proj.weight").full_shape, (Shape{96, 64}));
  EXPECT_EQ(m.at("layers.1.mlp.up_proj.weight").full_shape, (Shape{96, 64}));
  EXPECT_EQ(m.at("layers.1.mlp.down_proj.weight").full_shape, (Shape{64, 96}));
  EXPECT_EQ(m.at("layers.0.input_layernorm.weight").init, InitKind::ones);
  EXPECT_EQ(m.at("layers.0.post_attention_layernorm.weight").role, ParamRole::ln2_weight);
  EXPECT_EQ(m.at("norm.weight").role, ParamRole::lnf_weight);
  EXPECT_EQ(*m.at("layers.0.mlp.down_proj.weight").slot, LinearSlot::down);
  // No biases and no position table.
  for (const ParamSpec& p : t) {
    EXPECT_NE(p.role, ParamRole::linear_bias) << p.name;
    EXPECT_NE(p.role, ParamRole::position_embedding) << p.name;
  }
  // Offsets in order, without gaps.
  size_t at = 0;
  for (const ParamSpec& p : t) {
    EXPECT_EQ(p.offset, at) << p.name;
    at += p.numel();
  }
  // Tied: no lm_head, the embedding in the tied group.
  const auto tied = by_name(llama_param_table(llama(2, 8, 64, 250, 2, 96, true)));
  EXPECT_EQ(tied.count("lm_head.weight"), 0u);
  EXPECT_EQ(tied.at("embed_tokens.weight").tied, TiedGroup::embedding);
}

TEST(LlamaTable, TensorParallelSplitsKeyValueHeadsOnlyWhenEachRankGetsWholeOnes) {
  for (const auto [NKV, split] : {std::pair{4, true}, std::pair{2, true}, std::pair{1, false}}) {
    SCOPED_TRACE("n_kv_head " + std::to_string(NKV));
    const GPTConfig c = llama(1, 8, 64, 256, NKV, 96, false);
    const auto m = by_name(llama_param_table(c, {.tp_rank = 1, .tp_size = 2}));
    const ParamSpec& k = m.at("layers.0.self_attn.k_proj.weight");
    EXPECT_EQ(k.tp_dim, split ? 0 : -1);
    EXPECT_EQ(k.shape, (Shape{split ? NKV * 8 / 2 : NKV * 8, 64}));
    EXPECT_EQ(m.at("layers.0.self_attn.q_proj.weight").shape, (Shape{32, 64}));
    EXPECT_EQ(m.at("layers.0.self_attn.o_proj.weight").shape, (Shape{64, 32}));
    EXPECT_EQ(m.at("layers.0.mlp.up_proj.weight").shape, (Shape{48, 64}));
    EXPECT_EQ(m.at("layers.0.mlp.down_proj.weight").shape, (Shape{64, 48}));
    EXPECT_EQ(m.at("embed_tokens.weight").shape, (Shape{128, 64}));
    EXPECT_EQ(m.at("lm_head.weight").shape, (Shape{128, 64}));
    EXPECT_EQ(m.at("norm.weight").shape, (Shape{64}));
  }
}

TEST(LlamaTable, PipelineStagesHoldTheirLayersAndTheEmbeddingWhereItIsUsed) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const GPTConfig c = llama(4, 4, 32, 128, 2, 64, tied);
    const auto first = by_name(llama_param_table(c, {.layer_end = 2, .last_stage = false}));
    const auto last = by_name(llama_param_table(c, {.layer_begin = 2, .first_stage = false}));
    EXPECT_EQ(first.count("embed_tokens.weight"), 1u);
    EXPECT_EQ(first.count("norm.weight"), 0u);
    EXPECT_EQ(first.count("layers.1.mlp.up_proj.weight"), 1u);
    EXPECT_EQ(first.count("layers.2.mlp.up_proj.weight"), 0u);
    EXPECT_EQ(last.count("embed_tokens.weight"), tied ? 1u : 0u);  // the tied classifier
    EXPECT_EQ(last.count("lm_head.weight"), tied ? 0u : 1u);
    EXPECT_EQ(last.count("norm.weight"), 1u);
    EXPECT_EQ(last.count("layers.1.mlp.up_proj.weight"), 0u);
    // The whole model's positions (spec.index) whatever the stage.
    const auto whole = by_name(llama_param_table(c));
    for (const auto& [name, p] : last) EXPECT_EQ(p.index, whole.at(name).index) << name;
  }
}

TEST(LlamaTable, ConfigurationChecksNameTheKey) {
  auto error_of = [](const GPTConfig& c) {
    try {
      c.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of(llama(2, 8, 64, 256, 2, 96, false)), "");
  EXPECT_NE(error_of(llama(2, 8, 64, 256, 3, 96, false)).find("must be a multiple of model.n_kv_head"),
            std::string::npos);
  EXPECT_NE(error_of(llama(2, 8, 40, 256, 2, 96, false)).find("must be even"), std::string::npos);
  GPTConfig c = llama(2, 8, 64, 256, 2, 96, false);
  c.rope_scaling = {.factor = 8, .low_freq_factor = 4, .high_freq_factor = 1};
  EXPECT_NE(error_of(c).find("model.rope_scaling"), std::string::npos);
  c = llama(2, 8, 64, 256, 2, 96, false);
  c.norm_eps = 0;
  EXPECT_NE(error_of(c).find("model.norm_eps"), std::string::npos);
  // GPT-2 ignores the Llama keys; its defaults are GPT-2's.
  GPTConfig g;
  g.n_kv_head = 3;
  EXPECT_EQ(error_of(g), "");
  EXPECT_EQ(g.kv_heads(), g.n_head);
  EXPECT_EQ(g.mlp_width(), 4 * g.n_embd);
  EXPECT_TRUE(g.tied_classifier());
}

TEST(LlamaTable, EachArchitectureHasItsLinearLayers) {
  EXPECT_EQ(slots_text(LinearSlots::of(ModelArch::gpt2)), "qkv,attn-out,mlp-up,mlp-down");
  EXPECT_EQ(slots_text(LinearSlots::of(ModelArch::llama)), "q,k,v,o,gate,up,down");
  LinearSlots s;
  std::string bad;
  ASSERT_TRUE(parse_slots("qkv, gate", s, bad));
  EXPECT_EQ(slots_text(s.outside(ModelArch::gpt2)), "gate");
  EXPECT_EQ(slots_text(s.outside(ModelArch::llama)), "qkv");
  // Every linear weight of each table is of its architecture's slots.
  for (const ParamSpec& p : llama_param_table(llama(1, 4, 32, 64, 2, 48, true)))
    if (p.slot) EXPECT_TRUE(LinearSlots::of(ModelArch::llama).has(*p.slot)) << p.name;
  for (const ParamSpec& p : gpt_param_table(GPTConfig{}))
    if (p.slot) EXPECT_TRUE(LinearSlots::of(ModelArch::gpt2).has(*p.slot)) << p.name;
}

namespace {

bool same_tables(const std::vector<ParamSpec>& a, const std::vector<ParamSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const ParamSpec &x = a[i], &y = b[i];
    if (x.name != y.name || !(x.shape == y.shape) || x.offset != y.offset || x.tp_dim != y.tp_dim ||
        x.layer != y.layer || !(x.full_shape == y.full_shape) || x.tp_parts != y.tp_parts ||
        x.index != y.index || x.role != y.role || x.slot != y.slot || x.init != y.init ||
        x.tied != y.tied)
      return false;
  }
  return true;
}

}  // namespace

// model_param_table and shared_trainable_table keep the tables they make
// (core/kept.h): whatever they were asked before, they give the table the
// builders make for (cfg, shard[, LoRA]), in every field. 8 shards of two
// configurations and two LoRA settings, asked round after round, so that the
// kept tables are found again and made again after the scope changed.
TEST(ParamTable, KeptTablesEqualFreshOnes) {
  GPTConfig gpt2;
  gpt2.n_layer = 4;
  gpt2.n_head = 4;
  gpt2.n_embd = 64;
  gpt2.vocab_size = 300;
  const GPTConfig configs[] = {gpt2, llama(4, 4, 64, 300, 2, 96, false)};
  for (int round = 0; round < 3; ++round)
    for (const GPTConfig& cfg : configs)
      for (int lora_rank : {0, 4, 2})
        for (int tp : {1, 2})
          for (int tp_rank = 0; tp_rank < tp; ++tp_rank)
            for (int stage = 0; stage < 2; ++stage) {
              const ModelShard shard{.tp_rank = tp_rank,
                                     .tp_size = tp,
                                     .layer_begin = 2 * stage,
                                     .layer_end = 2 * stage + 2,
                                     .first_stage = stage == 0,
                                     .last_stage = stage == 1};
              const std::string where = "round " + std::to_string(round) + " LoRA rank " +
                                        std::to_string(lora_rank) + " tp " + std::to_string(tp_rank) +
                                        "/" + std::to_string(tp) + " stage " + std::to_string(stage);
              const std::vector<ParamSpec> fresh = cfg.arch == ModelArch::llama
                                                       ? llama_param_table(cfg, shard)
                                                       : gpt_param_table(cfg, shard);
              EXPECT_TRUE(same_tables(model_param_table(cfg, shard), fresh)) << where;
              GPTOptions opts;
              opts.lora.enabled = lora_rank > 0;
              opts.lora.rank = std::max(lora_rank, 1);
              opts.lora.targets = LinearSlots::of(cfg.arch);
              const std::vector<ParamSpec> trained =
                  opts.lora.enabled ? lora_param_table(cfg, shard, opts.lora) : fresh;
              EXPECT_TRUE(same_tables(*shared_trainable_table(cfg, shard, opts), trained)) << where;
            }
  // A configuration that differs in one key gets a table of its own.
  GPTConfig other = configs[1];
  other.n_layer = 6;
  EXPECT_EQ(model_param_table(other).size(), llama_param_table(other).size());
}
