// A Hugging Face model directory as a base (quant.base = DIR): DIR/config.json
// gives the architecture and the model's shape, DIR/model.safetensors or the
// shards that DIR/model.safetensors.index.json names hold the weights.
//
// config.json (model_type "gpt2"): n_layer, n_head, n_embd, vocab_size and
// n_positions (or n_ctx) are the model's shape keys; activation_function,
// layer_norm_epsilon and tie_word_embeddings, where present, must be what
// meshlm's GPT-2 computes (gelu_new, 1e-5, true). The index's weight_map
// names, for each tensor, a file that must lie inside DIR once symbolic
// links are followed (no absolute path, no "..", no link out of DIR).
//
// Every error is a RankError naming the file and the key or tensor.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/gpt_config.h"

namespace meshlm::load {

inline constexpr const char* kHfConfig = "config.json";
inline constexpr const char* kHfWeights = "model.safetensors";
inline constexpr const char* kHfIndex = "model.safetensors.index.json";

struct HfDirectory {
  std::string dir;
  // The shape keys config.json gives: n_layer, n_head, n_embd, vocab_size
  // and (GPT-2) max_seq_len = n_positions, the rows of its position table.
  GPTConfig model;
  // The safetensors files: the one file, or the index's, in the order it
  // first names them.
  std::vector<std::string> shards;
  // From the index: each tensor's file (a path in `shards`); empty for one file.
  std::map<std::string, std::string> weight_map;
};

// Whether `path` names a directory (following symbolic links).
bool is_directory(const std::string& path);
// Reads and checks config.json and the index (or finds model.safetensors).
HfDirectory read_hf_directory(const std::string& dir);

}  // namespace meshlm::load
