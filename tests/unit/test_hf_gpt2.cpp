// The Hugging Face GPT-2 table (load/hf_gpt2.h) that import, export and base
// loading share, against the shapes of GPT2Model's state dict written out
// by hand for a small model.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "load/hf_gpt2.h"
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
    const hf::Layout l = hf::layout_of(p);
    if (p.name == "wte.weight") EXPECT_EQ(l, hf::Layout::vocab_rows);
    else if (p.name == "wpe.weight") EXPECT_EQ(l, hf::Layout::first_rows);
    else if (p.name.ends_with("c_attn.weight") || p.name.ends_with("c_proj.weight") ||
             p.name.ends_with("c_fc.weight"))
      EXPECT_EQ(l, hf::Layout::transposed) << p.name;
    else EXPECT_EQ(l, hf::Layout::same) << p.name;
  }
  EXPECT_EQ(hf::file_names("wte.weight"),
            (std::vector<std::string>{"wte.weight", "transformer.wte.weight"}));
  EXPECT_EQ(hf::block_of("h.7.mlp.c_fc.weight"), 7);
  EXPECT_EQ(hf::block_of("transformer.h.12.ln_1.bias"), 12);
  EXPECT_FALSE(hf::block_of("wte.weight").has_value());
  EXPECT_FALSE(hf::block_of("h.x.ln_1.bias").has_value());
  EXPECT_FALSE(hf::block_of("h.1234567890.ln_1.bias").has_value());  // ten digits
}
