// Where the frozen base model's weights come from, one logical tensor at a
// time: a reader fills the tensor it is asked for and holds no other, so
// loading GPT-2 XL never needs a second copy of the model in memory.
//
// Three kinds of source, chosen by open_base_source()'s spec string:
//
//  * "" or "init": GPT-2 initialisation from a seed (init_tensor), the
//    exact values a fresh GPT::init_weights(seed) gives.
//  * "*.safetensors": a Hugging Face GPT-2 checkpoint. Names may carry a
//    "transformer." prefix; the Conv1D weights (attn.c_attn, attn.c_proj,
//    mlp.c_fc, mlp.c_proj) are stored (in, out) and are transposed to
//    meshlm's (out, in); wte has vocab_size rows and is padded with zero rows
//    to padded_vocab_size; wpe may have MORE rows than max_seq_len (GPT-2's
//    1024 positions trained at a shorter context): its first max_seq_len rows
//    are taken. Tensors meshlm does not use (h.N.attn.bias, h.N.attn.
//    masked_bias, the tied lm_head.weight, ...) are ignored. F32, F16, BF16
//    and F64 are read; values are converted exactly to float (F64 rounds).
//  * a directory: a Hugging Face model (load/hf_dir.h): config.json, whose
//    shape must be the model's (max_seq_len at most its n_positions), and
//    model.safetensors or the shards its index names, read as one file.
//  * "*.h5" / "*.hdf5": a meshlm file, one float32 dataset per logical
//    tensor at /params/<name> in meshlm names and layout (linear weights
//    (out, in), wte already padded), as write_params_h5() writes it. The
//    root attributes format_version (when present) must be 1 and vocab_size
//    (when present) must equal the model's: padded rows would hide a
//    different vocabulary from the shape check.
//
// Errors are RankErrors naming the tensor and the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/gpt_config.h"
#include "model/param_table.h"

namespace meshlm::load {

inline constexpr int kParamsFormatVersion = 1;

class BaseSource {
public:
  virtual ~BaseSource() = default;
  // "safetensors file 'x'", "meshlm HDF5 file 'x'", "GPT-2 initialisation, seed 1337".
  virtual std::string describe() const = 0;
  // The files whose bytes define the source (for the cache hash); empty for init.
  virtual std::vector<std::string> files() const = 0;
  // Fills out[0:numel(full_shape)] with the logical tensor `spec` (spec.
  // full_shape, meshlm layout: linear weights (out, in), wte padded to
  // full_shape[0] rows with zeros). `spec` may come from a shard's table:
  // only its name, full_shape and index are used. Throws RankError naming
  // the tensor and the file when it is missing, its shape does not match,
  // or a value is NaN or infinite (with the value's index and position):
  // nothing trains on a number that was not checked.
  void read(const ParamSpec& spec, float* out);
  // Rows [row0, row0 + nrows) of the same tensor (row_floats(spec) elements
  // each) into out[0, nrows * row_floats(spec)), checked the same way: what
  // lets a caller hold one block of a tensor instead of all of it.
  void read_rows(const ParamSpec& spec, int64_t row0, int64_t nrows, float* out);

protected:
  // The source's own reading of those rows, without the check of the values.
  virtual void fetch_rows(const ParamSpec& spec, int64_t row0, int64_t nrows, float* out) = 0;
  // The tensor's name where the source holds it (a Hugging Face file's
  // "model.layers.0..."), for errors; meshlm's by default.
  virtual std::string name_in_source(const ParamSpec& spec) const { return spec.name; }
};

// Opens the source named by `spec_string` for the model `cfg` (seed: for
// "init" only) and checks up front that every tensor of gpt_param_table(cfg)
// is there with the right shape and a readable dtype: one RankError naming
// the first problem. An unknown extension is a RankError naming the file and
// what is accepted. A meshlm checkpoint's datasets are verified against
// their checksums: those of the table's index i with i % checksum_parts ==
// checksum_part (ranks that each open the file pass their rank and count,
// and share the hashing; their errors must then be gathered, comm/errors.h).
std::unique_ptr<BaseSource> open_base_source(const std::string& spec_string, const GPTConfig& cfg,
                                             uint64_t seed, int checksum_part = 0,
                                             int checksum_parts = 1);

// The identity of a base's bytes: the XXH3-128 of its one file, or of the
// concatenated hashes of its files in order (a directory's shards). What the
// quantized cache's key and a LoRA checkpoint's base_hash hold.
std::string files_hash(const std::vector<std::string>& files);
// The files of the base `spec_string` names (a file, or a directory's
// shards; none for initialisation).
std::vector<std::string> base_files(const std::string& spec_string);

// Writes a meshlm base file: /params/<name> for every tensor of
// gpt_param_table(cfg) (float32, logical shapes), root attributes
// format_version = kParamsFormatVersion and n_layer, n_head, n_embd,
// vocab_size, max_seq_len. `full_params` holds the tensors in table order
// (as Engine::gather_params returns them). Written under a temporary name
// and renamed when complete.
void write_params_h5(const std::string& path, const GPTConfig& cfg,
                     const std::vector<float>& full_params);

}  // namespace meshlm::load
