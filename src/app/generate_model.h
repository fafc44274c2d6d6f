// The model `meshlm generate` runs, from what MODEL names (app/generate.h):
//
//   * a Hugging Face directory (GPT-2 or Llama: config.json and its
//     safetensors, load/hf_dir.h), read through load::open_base_source;
//   * a GPT-2 safetensors file, its shape from its tensors and n_head from
//     --n_head, the file's __metadata__ meshlm.n_head or GPT-2's 12 (as
//     `meshlm ckpt import` takes them: ckpt_model::infer_gpt2_model);
//   * a meshlm checkpoint (.h5: a run's, or ckpt import's): its /meta gives
//     the model, /params the weights (checksums verified); a LoRA
//     checkpoint's is its base merged with its adapters exactly as `meshlm
//     ckpt export --merge` makes it (app/ckpt_model.h), the base from /meta
//     quant_base or --base.
//
// Every value is checked finite. Errors are RankErrors naming the file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/gpt_config.h"
#include "model/param_table.h"

namespace meshlm {

struct GenerateModelOptions {
  std::string path;              // MODEL
  std::string base;              // --base (a LoRA checkpoint's)
  bool base_given = false;
  int n_head = 0;                // --n_head (a safetensors file's); 0 = not given
};

class GenerateModel {
public:
  virtual ~GenerateModel() = default;
  const GPTConfig& config() const { return cfg_; }
  // "Hugging Face directory 'x'", "checkpoint 'x' (LoRA, merged onto ...)".
  const std::string& describe() const { return what_; }
  // A Hugging Face directory's path (where its tokenizer may be), else "".
  const std::string& directory() const { return dir_; }
  // The model's own end-of-sequence ids (load::eos_token_ids): a directory's
  // generation_config.json or config.json, a checkpoint's /meta hf_config.
  const std::vector<uint32_t>& eos_ids() const { return eos_; }
  // Writes tensor `p` of model_param_table(config()) to out (p.numel()
  // floats, host memory); RankError naming the tensor and the file for a
  // value that is not finite.
  void read_checked(const ParamSpec& p, float* out);

protected:
  virtual void read(const ParamSpec& p, float* out) = 0;
  GPTConfig cfg_;
  std::string what_, dir_;
  std::vector<uint32_t> eos_;
};

// Opens MODEL and reads its configuration (the weights come with fill()).
std::unique_ptr<GenerateModel> open_generate_model(const GenerateModelOptions& o);

}  // namespace meshlm
