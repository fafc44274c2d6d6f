// The model a checkpoint holds, one logical tensor at a time, in meshlm's
// layout (linear weights (out, in), the vocabulary padded): what `meshlm
// ckpt export` writes and `meshlm generate` runs.
//
//   * A full-training checkpoint (or ckpt import's): its /params/<name>,
//     each dataset's checksum verified before a value of it is used.
//   * A LoRA checkpoint: its frozen base as the run computed with it (read
//     from its source, load::open_base_source; every matrix quantized in
//     /meta quant_type exactly as load::fill_store does and dequantized by
//     quant::dequantize_ref, vectors as they are), each adapted matrix plus
//     (alpha / r) B A (the sum over r in float64, rounded once). The base is
//     /meta quant_base or one the caller names, refused unless its XXH3-128
//     is /meta base_hash.
//
// Also the shape of a GPT-2 safetensors file (infer_gpt2_model), which ckpt
// import and generate read alike. Everything runs on one rank; errors are
// RankErrors naming the file and the dataset or key.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "load/base_source.h"
#include "model/gpt_config.h"
#include "model/linear_slot.h"
#include "model/param_table.h"
#include "quant/quant_config.h"

namespace meshlm::ckpt_model {

// "gpt2, n_layer 2, n_head 4, ..." for the tools' lines and errors.
std::string model_str(const GPTConfig& c);
// The configuration checked; a CollectiveError of validate() becomes this
// rank's error naming `where` (the tools run on rank 0 alone).
void validate_model(const GPTConfig& cfg, const std::string& where);

// A checkpoint's /meta, and what its values mean here.
struct CkptMeta {
  std::string path;
  GPTConfig cfg;
  int64_t step = 0;
  bool lora = false;
  // Under LoRA:
  int lora_rank = 0;
  double lora_alpha = 0;
  LinearSlots targets;
  std::string targets_text, quant_type_text, quant_base, base_hash;
  quant::QuantType quant_type = quant::QuantType::nf4;
  uint64_t seed = 0;
  std::string hf_config;  // /meta hf_config: the Hugging Face config.json keys an export keeps
};
// /meta as io::ckpt::read_meta reads it, then what its values mean: the
// model (validated), the adapters' linear layers, the base's format.
CkptMeta read_meta(hid_t file, const std::string& path);

// The table of the adapters the checkpoint holds (names "<matrix>.lora_A",
// ".lora_B", logical shapes, in the base table's order).
std::vector<ParamSpec> adapter_table(const CkptMeta& m);

// A logical tensor as a (rows, cols) matrix; a vector is (n, 1).
class MatrixSource {
public:
  MatrixSource(int64_t rows, int64_t cols) : rows_(rows), cols_(cols) {}
  virtual ~MatrixSource() = default;
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // out(nr, nc) = rows [r0, r0 + nr) x columns [c0, c0 + nc), row-major.
  virtual void block(int64_t r0, int64_t nr, int64_t c0, int64_t nc, float* out) = 0;

private:
  int64_t rows_, cols_;
};

// The dataset `name` of the checkpoint at `path` (open as `file`), checked
// (there, `shape`, float, its checksum attribute) and verified against its
// checksum before anything of it is returned.
std::unique_ptr<MatrixSource> dataset_source(hid_t file, const std::string& path,
                                             const std::string& name, const Shape& shape);

// One tensor of the model: its spec (model_param_table's, logical shape)
// and how to open it when its turn comes (one tensor held at a time).
struct ModelTensor {
  ParamSpec spec;
  std::function<std::unique_ptr<MatrixSource>()> open;
};

// A full-training checkpoint's /params, every dataset checked (present, its
// shape, its checksum attribute) up front. `m` and `file` must outlive the
// openers.
std::vector<ModelTensor> model_tensors(hid_t file, const CkptMeta& m);

// Every adapter of `adapters` under /lora with its shape, and nothing there
// that the targets do not name.
void check_adapters(hid_t file, const CkptMeta& m, const std::vector<ParamSpec>& adapters);

// The base of a LoRA checkpoint: the file or directory `base` names ("" or
// "init": the model's initialisation from /meta seed), checked against /meta
// base_hash. Says which base on `notes` (a line prefixed "# " + `tool`).
std::unique_ptr<load::BaseSource> open_lora_base(const CkptMeta& m, const std::string& base,
                                                 const std::string& tool,
                                                 std::FILE* notes = stdout);

// The whole model as the LoRA run computed with it: every tensor of the
// base in the store's format (load::make_manifest), each adapted matrix
// with its W + s B A. `m`, `file` and `base` must outlive the openers.
std::vector<ModelTensor> merged_tensors(hid_t file, const CkptMeta& m,
                                        const std::vector<ParamSpec>& adapters,
                                        load::BaseSource& base);

// The model a Hugging Face GPT-2 file describes: n_layer from its h.N
// blocks, vocab_size and n_embd from wte, max_seq_len from wpe's rows;
// n_head from `heads` (the file's shapes cannot tell it).
GPTConfig infer_gpt2_model(const io::SafetensorsFile& f, int heads);

}  // namespace meshlm::ckpt_model
