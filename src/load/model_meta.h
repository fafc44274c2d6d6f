// The model of a checkpoint's /meta (io/checkpoint_meta.h) and back: its
// sizes, arch and, for a Llama, what the family adds. One mapping for the
// saves and resume of training and for the meshlm ckpt tools.
#pragma once

#include <optional>
#include <string>

#include "io/checkpoint_meta.h"
#include "model/gpt_config.h"

namespace meshlm::load {

// Sets m.sizes, m.arch and m.llama from `cfg`.
void set_model_meta(io::ckpt::Meta& m, const GPTConfig& cfg);

// The model /meta describes (not validated: GPTConfig::validate() is the
// caller's, naming the file).
GPTConfig model_of_meta(const io::ckpt::Meta& m);

// The model of the meshlm checkpoint at `path` (its /meta); none when the
// path is not a regular HDF5 file with a /meta group (a base file of
// /params only, a FIFO, nothing at all: never opened but a regular file).
// RankError naming the file when /meta is there but unreadable.
std::optional<GPTConfig> checkpoint_model(const std::string& path);

// The Hugging Face config.json keys an export of a model made from `base`
// writes back (HfDirectory::kept): a directory's own, a meshlm checkpoint's
// /meta hf_config; "" for anything else (a safetensors file, "init").
std::string kept_hf_config(const std::string& base);

// "" when `m` describes `cfg`; else the first [model] key that differs, as
// "model.KEY = <m's> there, <cfg's> " + `here` ("in this run").
std::string model_meta_difference(const io::ckpt::Meta& m, const GPTConfig& cfg,
                                  const std::string& here);
// The same between two models: `there`'s and `cfg`'s.
std::string model_difference(const GPTConfig& there, const GPTConfig& cfg, const std::string& here);

}  // namespace meshlm::load
