// The Hugging Face names and layouts (load/hf_layout.h) that import, export
// and base loading share, against the shapes of GPT2Model's and
// LlamaForCausalLM's state dicts written out by hand for small models.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "load/hf_layout.h"
#include "model/param_table.h"

using namespace meshlm;
namespace hf = meshlm::load::hf;

TEST(HfGpt2, FileShapesAreThoseOfGpt2ModelsStateDict) {
  const GPTConfig cfg{.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 50, .max_seq_len = 16};
  // GPT2Model: Conv1D weights (in, out), wte (vocab_size, C), wpe (n_positions, C).
  const std::map<std::string, std::vector<int64_t>> want = {
      {"wte.weight", {50, 8}},
      {"wpe.weight", {16, 8}},
      {"h.1.ln_1.weight", {8}},
      {"h.1.attn.c_attn.weight", {8, 24}},
      {"h.1.attn.c_attn.bias", {24}},
      {"h.1.attn.c_proj.weight", {8, 8}},
      {"h.1.mlp.c_fc.weight", {8, 32}},
      {"h.1.mlp.c_proj.weight", {32, 8}},
      {"ln_f.bias", {8}},
  };
  size_t seen = 0;
  for (const ParamSpec& p : gpt_param_table(cfg)) {
    const auto it = want.find(p.name);
    if (it == want.end()) continue;
    ++seen;
    EXPECT_EQ(hf::file_shape(p, cfg), it->second) << p.name;
  }
  EXPECT_EQ(seen, want.size());
}

TEST(HfGpt2, LayoutsNamesAndBlocks) {
  const GPTConfig cfg{.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 50, .max_seq_len = 16};
  for (const ParamSpec& p : gpt_param_table(cfg)) {
    const hf::Layout l = hf::layout_of(p, ModelArch::gpt2);
    if (p.name == "wte.weight") EXPECT_EQ(l, hf::Layout::vocab_rows);
    else if (p.name == "wpe.weight") EXPECT_EQ(l, hf::Layout::first_rows);
    else if (p.name.ends_with("c_attn.weight") || p.name.ends_with("c_proj.weight") ||
             p.name.ends_with("c_fc.weight"))
      EXPECT_EQ(l, hf::Layout::transposed) << p.name;
    else EXPECT_EQ(l, hf::Layout::same) << p.name;
  }
  EXPECT_EQ(hf::file_names("wte.weight", ModelArch::gpt2),
            (std::vector<std::string>{"wte.weight", "transformer.wte.weight"}));
  EXPECT_EQ(hf::block_of("h.7.mlp.c_fc.weight", ModelArch::gpt2), 7);
  EXPECT_EQ(hf::block_of("transformer.h.12.ln_1.bias", ModelArch::gpt2), 12);
  EXPECT_FALSE(hf::block_of("wte.weight", ModelArch::gpt2).has_value());
  EXPECT_FALSE(hf::block_of("h.x.ln_1.bias", ModelArch::gpt2).has_value());
  EXPECT_FALSE(hf::block_of("h.1234567890.ln_1.bias", ModelArch::gpt2).has_value());  // ten digits
}

TEST(HfLlama, FileShapesLayoutsAndNamesAreLlamaForCausalLMs) {
  GPTConfig cfg{.n_layer = 2, .n_head = 4, .n_embd = 16, .vocab_size = 70, .max_seq_len = 32};
  cfg.arch = ModelArch::llama;
  cfg.n_kv_head = 2;
  cfg.intermediate_size = 24;
  cfg.tie_word_embeddings = false;
  // LlamaForCausalLM: nn.Linear weights (out, in), embed_tokens and lm_head
  // (vocab_size, hidden), "model." before every name but lm_head's.
  const std::map<std::string, std::pair<std::string, std::vector<int64_t>>> want = {
      {"embed_tokens.weight", {"model.embed_tokens.weight", {70, 16}}},
      {"layers.1.input_layernorm.weight", {"model.layers.1.input_layernorm.weight", {16}}},
      {"layers.1.self_attn.q_proj.weight", {"model.layers.1.self_attn.q_proj.weight", {16, 16}}},
      {"layers.1.self_attn.k_proj.weight", {"model.layers.1.self_attn.k_proj.weight", {8, 16}}},
      {"layers.1.self_attn.v_proj.weight", {"model.layers.1.self_attn.v_proj.weight", {8, 16}}},
      {"layers.1.self_attn.o_proj.weight", {"model.layers.1.self_attn.o_proj.weight", {16, 16}}},
      {"layers.1.mlp.gate_proj.weight", {"model.layers.1.mlp.gate_proj.weight", {24, 16}}},
      {"layers.1.mlp.up_proj.weight", {"model.layers.1.mlp.up_proj.weight", {24, 16}}},
      {"layers.1.mlp.down_proj.weight", {"model.layers.1.mlp.down_proj.weight", {16, 24}}},
      {"norm.weight", {"model.norm.weight", {16}}},
      {"lm_head.weight", {"lm_head.weight", {70, 16}}},
  };
  size_t seen = 0;
  for (const ParamSpec& p : llama_param_table(cfg)) {
    const hf::Layout l = hf::layout_of(p, ModelArch::llama);
    EXPECT_NE(l, hf::Layout::transposed) << p.name;
    EXPECT_NE(l, hf::Layout::first_rows) << p.name;
    EXPECT_EQ(l == hf::Layout::vocab_rows, p.name == "embed_tokens.weight" || p.name == "lm_head.weight")
        << p.name;
    const auto it = want.find(p.name);
    if (it == want.end()) continue;
    ++seen;
    EXPECT_EQ(hf::file_shape(p, cfg), it->second.second) << p.name;
    EXPECT_EQ(hf::directory_name(p.name, ModelArch::llama), it->second.first) << p.name;
  }
  EXPECT_EQ(seen, want.size());
  EXPECT_EQ(hf::file_names("norm.weight", ModelArch::llama),
            (std::vector<std::string>{"norm.weight", "model.norm.weight"}));
  EXPECT_EQ(hf::directory_name("h.0.ln_1.weight", ModelArch::gpt2), "h.0.ln_1.weight");
  EXPECT_EQ(hf::block_of("model.layers.7.mlp.up_proj.weight", ModelArch::llama), 7);
  EXPECT_EQ(hf::block_of("layers.3.input_layernorm.weight", ModelArch::llama), 3);
  EXPECT_FALSE(hf::block_of("h.3.ln_1.weight", ModelArch::llama).has_value());
  EXPECT_FALSE(hf::block_of("model.norm.weight", ModelArch::llama).has_value());
  EXPECT_FALSE(hf::block_of("lm_head.weight", ModelArch::llama).has_value());
}
