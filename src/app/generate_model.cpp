// The model `meshlm generate` runs (app/generate_model.h).
#include "app/generate_model.h"

#include <cmath>
#include <filesystem>
#include <map>

#include "app/ckpt_model.h"
#include "core/error.h"
#include "core/files.h"
#include "io/h5.h"
#include "io/safetensors.h"
#include "load/base_source.h"
#include "load/hf_dir.h"

namespace meshlm {

namespace {

namespace h5 = io::h5;

// GPT-2's head count, a safetensors file's default (its shapes do not tell it).
constexpr int kDefaultHeads = 12;

// A Hugging Face directory or a GPT-2 safetensors file: load::BaseSource.
class SourceModel final : public GenerateModel {
public:
  SourceModel(const GPTConfig& cfg, const std::string& path, std::string what, std::string dir,
              std::vector<uint32_t> eos = {}) {
    cfg_ = cfg;
    what_ = std::move(what);
    dir_ = std::move(dir);
    eos_ = std::move(eos);
    src_ = load::open_base_source(path, cfg_, 0);
  }

protected:
  void read(const ParamSpec& p, float* out) override { src_->read(p, out); }

private:
  std::unique_ptr<load::BaseSource> src_;
};

// A meshlm checkpoint: /params, or a LoRA checkpoint's merged model.
class CheckpointModel final : public GenerateModel {
public:
  explicit CheckpointModel(const GenerateModelOptions& o)
      : file_(h5::open_file(o.path)), meta_(ckpt_model::read_meta(file_, o.path)) {
    cfg_ = meta_.cfg;
    eos_ = load::eos_token_ids("", meta_.hf_config);
    if (o.base_given && !meta_.lora)
      throw RankError("--base is for a LoRA checkpoint; '" + o.path +
                          "' is a full model's (its /params are the weights)",
                      MESHLM_HERE);
    std::vector<ckpt_model::ModelTensor> tensors;
    if (!meta_.lora) {
      what_ = "checkpoint '" + o.path + "' (step " + std::to_string(meta_.step) + ")";
      tensors = ckpt_model::model_tensors(file_, meta_);
    } else {
      const std::vector<ParamSpec> adapters = ckpt_model::adapter_table(meta_);
      ckpt_model::check_adapters(file_, meta_, adapters);
      const std::string base = o.base_given ? o.base : meta_.quant_base;
      base_ = ckpt_model::open_lora_base(meta_, base, "generate", stderr);
      what_ = "LoRA checkpoint '" + o.path + "' (step " + std::to_string(meta_.step) +
              ") merged onto " + base_->describe() + " in " + meta_.quant_type_text;
      tensors = ckpt_model::merged_tensors(file_, meta_, adapters, *base_);
    }
    for (ckpt_model::ModelTensor& t : tensors) open_[t.spec.name] = std::move(t.open);
  }

protected:
  void read(const ParamSpec& p, float* out) override {
    const auto it = open_.find(p.name);
    MESHLM_CHECK(it != open_.end(), "a tensor of the model's table is not in the checkpoint's");
    std::unique_ptr<ckpt_model::MatrixSource> s = it->second();
    s->block(0, s->rows(), 0, s->cols(), out);
  }

private:
  h5::File file_;
  ckpt_model::CkptMeta meta_;
  std::unique_ptr<load::BaseSource> base_;
  std::map<std::string, std::function<std::unique_ptr<ckpt_model::MatrixSource>()>> open_;
};

std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

// A GPT-2 safetensors file's model: its shapes, n_head as ckpt import takes it.
std::unique_ptr<GenerateModel> safetensors_model(const GenerateModelOptions& o) {
  const io::SafetensorsFile f(o.path);
  int heads = kDefaultHeads;
  std::string from = "GPT-2's default; --n_head sets it";
  if (o.n_head > 0) {
    heads = o.n_head;
    from = "--n_head";
  } else if (const auto it = f.metadata().find("meshlm.n_head"); it != f.metadata().end()) {
    try {
      heads = std::stoi(it->second);
    } catch (const std::exception&) {
      heads = 0;
    }
    if (heads < 1)
      throw RankError("safetensors file '" + o.path + "': __metadata__ meshlm.n_head '" +
                          it->second + "' is not a positive integer",
                      MESHLM_HERE);
    from = "the file's __metadata__";
  }
  const GPTConfig cfg = ckpt_model::infer_gpt2_model(f, heads);
  ckpt_model::validate_model(cfg, "safetensors file '" + o.path + "' (n_head " +
                                      std::to_string(heads) + " from " + from + ")");
  return std::make_unique<SourceModel>(cfg, o.path, "safetensors file '" + o.path + "'", "");
}

}  // namespace

void GenerateModel::read_checked(const ParamSpec& p, float* out) {
  read(p, out);
  for (size_t i = 0; i < p.numel(); ++i)
    if (!std::isfinite(out[i]))
      throw RankError(what_ + ": tensor '" + p.name + "' holds " +
                          (std::isnan(out[i]) ? "NaN" : "an infinite value") + " at index " +
                          std::to_string(i),
                      MESHLM_HERE);
}

std::unique_ptr<GenerateModel> open_generate_model(const GenerateModelOptions& o) {
  const std::string& path = o.path;
  std::error_code ec;
  if (load::is_directory(path)) {
    if (o.n_head > 0) throw RankError("--n_head is for a safetensors file; '" + path + "' is a "
                                      "Hugging Face directory, whose config.json gives the model",
                                      MESHLM_HERE);
    const load::HfDirectory d = load::read_hf_directory(path);
    ckpt_model::validate_model(d.model, "Hugging Face directory '" + path + "'");
    return std::make_unique<SourceModel>(d.model, path, "Hugging Face directory '" + path + "'", path,
                                         load::eos_token_ids(path, d.kept));
  }
  if (!std::filesystem::exists(path, ec))
    throw RankError("model '" + path + "': no such file or directory", MESHLM_HERE);
  const std::string kind = non_regular_kind(path);
  if (!kind.empty()) throw RankError("model '" + path + "' is " + kind, MESHLM_HERE);
  const bool st = lower_extension(path) == ".safetensors";
  if (o.base_given && st)
    throw RankError("--base is for a LoRA checkpoint; '" + path + "' is a safetensors file",
                    MESHLM_HERE);
  if (st) return safetensors_model(o);
  if (o.n_head > 0)
    throw RankError("--n_head is for a safetensors file; '" + path + "' is not one", MESHLM_HERE);
  if (!h5::is_hdf5_file(path))
    throw RankError("model '" + path + "': not a meshlm checkpoint (HDF5), a safetensors file or a "
                        "Hugging Face directory",
                    MESHLM_HERE);
  return std::make_unique<CheckpointModel>(o);
}

}  // namespace meshlm
