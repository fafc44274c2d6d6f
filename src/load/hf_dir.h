// A Hugging Face model directory as a base (quant.base = DIR): DIR/config.json
// gives the architecture and the model's shape, DIR/model.safetensors or the
// shards that DIR/model.safetensors.index.json names hold the weights.
//
// config.json, model_type "gpt2": n_layer, n_head, n_embd, vocab_size and
// n_positions (or n_ctx) are the model's shape keys; activation_function,
// layer_norm_epsilon and tie_word_embeddings, where present, must be what
// meshlm's GPT-2 computes (gelu_new, 1e-5, true).
//
// model_type "llama" (LlamaConfig's keys, its defaults where a key is
// absent): num_hidden_layers, num_attention_heads, num_key_value_heads
// (default: the heads), hidden_size, intermediate_size, vocab_size,
// max_position_embeddings, rms_norm_eps (1e-6), rope_theta (10000; or
// inside rope_parameters), rope_scaling null, "default" or "llama3" with
// factor, low_freq_factor, high_freq_factor and
// original_max_position_embeddings, tie_word_embeddings (false). hidden_act,
// attention_bias, mlp_bias, pretraining_tp and head_dim, where present, must
// be what meshlm computes (silu, false, false, 1, hidden_size / heads).
//
// rope_scaling null or {} gives way to rope_parameters, as in transformers.
//
// model.safetensors and each file the index's weight_map names must lie
// inside DIR once symbolic links are followed (no absolute path, no "..", no
// link out of DIR), with one exception: Hugging Face's download cache, where
// DIR is <repo>/snapshots/<revision> and each of its files links to
// <repo>/blobs/<hash>.
//
// Every error is a RankError naming the file and the key or tensor.
#pragma once

#include <cstdint>
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
  // The model config.json gives: its arch and every [model] key of it;
  // max_seq_len is GPT-2's n_positions (the rows of its position table) or
  // Llama's max_position_embeddings.
  GPTConfig model;
  // The safetensors files: the one file, or the index's, in the order it
  // first names them.
  std::vector<std::string> shards;
  // From the index: each tensor's file (a path in `shards`); empty for one file.
  std::map<std::string, std::string> weight_map;
  // The keys of config.json that meshlm keeps for an export without
  // computing with them (kKeptConfigKeys), as a JSON object; "" when it has
  // none. A checkpoint holds them in /meta (hf_config).
  std::string kept;
};

// The token ids the model was trained with, and a Llama's own context
// (max_position_embeddings: model.max_seq_len may be less for a run).
inline constexpr const char* kKeptConfigKeys[] = {"bos_token_id", "eos_token_id", "pad_token_id",
                                                  "max_position_embeddings"};

// Whether `path` names a directory (following symbolic links).
bool is_directory(const std::string& path);
// Reads and checks config.json and the index (or finds model.safetensors).
HfDirectory read_hf_directory(const std::string& dir);

// config.json for `cfg` as transformers writes it for GPT2LMHeadModel or
// LlamaForCausalLM (architectures, model_type, the shape keys, torch_dtype
// `dtype` as "float32" / "bfloat16" / "float16"), plus "meshlm": `origin`,
// the mark by which meshlm recognises a directory it wrote. `kept`
// (HfDirectory::kept, "" for none) adds its keys; a Llama's
// max_position_embeddings is then the larger of its and cfg.max_seq_len.
// RankError when `kept` is not a JSON object.
std::string hf_config_json(const GPTConfig& cfg, const std::string& dtype,
                           const std::map<std::string, std::string>& origin,
                           const std::string& kept = "");
// The ids at which the model's generation ends: eos_token_id (a number or a
// list) of `dir`/generation_config.json where `dir` is a directory holding
// one, else of `kept` (HfDirectory::kept, a checkpoint's /meta hf_config);
// none when neither has it. RankError naming the file (or "/meta
// hf_config") and the key when it is not whole numbers >= 0.
std::vector<uint32_t> eos_token_ids(const std::string& dir, const std::string& kept);
// Whether `dir`'s config.json carries that mark.
bool written_by_meshlm(const std::string& dir);

}  // namespace meshlm::load
