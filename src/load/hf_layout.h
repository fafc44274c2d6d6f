// The models as Hugging Face stores them: the one table of names and
// layouts that base loading (load/base_source.cpp), `meshlm ckpt import`
// and `meshlm ckpt export` (app/ckpt_convert.cpp) share. meshlm's names
// (model/param_table.h) are Hugging Face's base model's:
//
//  * GPT-2: GPT2Model's state dict (wte.weight, h.0.attn.c_attn.weight, ...);
//    GPT2LMHeadModel prefixes them with "transformer.". The Conv1D weights
//    (c_attn, c_proj, c_fc) are stored (in, out).
//  * Llama: LlamaModel's (embed_tokens.weight, layers.0.self_attn.q_proj.
//    weight, ...); LlamaForCausalLM prefixes them with "model." and keeps
//    its own lm_head.weight unprefixed. nn.Linear weights are (out, in), as
//    meshlm's; q_proj and k_proj are in the rotate-half order meshlm's rope
//    uses.
//
// Token embeddings and lm_head hold vocab_size rows in a file, meshlm's are
// padded to padded_vocab_size with zeros.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt_config.h"
#include "model/param_table.h"

namespace meshlm::load::hf {

// The prefix of every name in the *ForCausalLM / *LMHeadModel state dict
// ("transformer." for GPT-2, "model." for Llama), lm_head aside.
const char* prefix(ModelArch arch);

// How meshlm's tensor sits in a Hugging Face file.
enum class Layout {
  same,        // the same shape and layout (vectors, Llama's linear weights, the LoRA adapters)
  transposed,  // a GPT-2 Conv1D weight: the file's (in, out) is meshlm's (out, in)
  vocab_rows,  // token embeddings, lm_head: vocab_size rows; meshlm's are padded with zeros
  first_rows,  // GPT-2's wpe: a file read holds at least max_seq_len rows, a file written max_seq_len
};
Layout layout_of(const ParamSpec& p, ModelArch arch);

// The shape of meshlm's tensor `p` in a file written for `cfg`.
std::vector<int64_t> file_shape(const ParamSpec& p, const GPTConfig& cfg);

// The names a file may give meshlm's tensor `name`: as it is, then prefixed.
std::vector<std::string> file_names(const std::string& name, ModelArch arch);

// The name meshlm writes for `name` in a Hugging Face directory (the
// *ForCausalLM state dict: prefixed, lm_head.weight as it is).
std::string directory_name(const std::string& name, ModelArch arch);

// The block index of a file's tensor name ("h.7.mlp.c_fc.weight",
// "model.layers.7.mlp.up_proj.weight", prefixed or not); none for a tensor
// outside the blocks or an index of ten digits or more.
std::optional<long long> block_of(const std::string& file_name, ModelArch arch);

}  // namespace meshlm::load::hf
