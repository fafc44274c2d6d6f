// GPT-2 as Hugging Face stores it (GPT2Model's state dict; the names of
// GPT2LMHeadModel carry a "transformer." prefix): the one table of names
// and layouts that base loading (load/base_source.cpp), `meshlm ckpt
// import` and `meshlm ckpt export` (app/ckpt_convert.cpp) share. The names
// are meshlm's parameter table's (model/param_table.h), which follows
// GPT2Model; a second architecture adds a table of its own beside this one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt_config.h"
#include "model/param_table.h"

namespace meshlm::load::hf {

// GPT2LMHeadModel's prefix of every name.
inline constexpr const char* kPrefix = "transformer.";

// How meshlm's tensor sits in a Hugging Face GPT-2 file.
enum class Layout {
  same,        // the same shape and layout (vectors; the LoRA adapters)
  transposed,  // a Conv1D weight (c_attn, c_proj, c_fc): the file's (in, out) is meshlm's (out, in)
  vocab_rows,  // wte: vocab_size rows; meshlm's are padded to padded_vocab_size with zeros
  first_rows,  // wpe: a file read holds at least max_seq_len rows, a file written max_seq_len
};
Layout layout_of(const ParamSpec& p);

// The shape of meshlm's tensor `p` in a file written for `cfg`.
std::vector<int64_t> file_shape(const ParamSpec& p, const GPTConfig& cfg);

// The names a file may give meshlm's tensor `name`: as it is, then prefixed.
std::vector<std::string> file_names(const std::string& name);

// The block index of a file's tensor name ("h.7.mlp.c_fc.weight", prefixed
// or not); none for a tensor outside the blocks or an index of ten digits
// or more.
std::optional<long long> block_of(const std::string& file_name);

}  // namespace meshlm::load::hf
