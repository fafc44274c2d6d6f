#include "load/base_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "io/checkpoint_meta.h"
#include "io/h5.h"
#include "io/hash.h"
#include "io/safetensors.h"
#include "load/hf_dir.h"
#include "load/hf_layout.h"
#include "load/model_meta.h"

namespace meshlm::load {

using io::SafetensorsFile;
using io::SafetensorsTensor;
using io::safetensors_dtype_is_float;
namespace h5 = io::h5;

namespace {

std::string dims_str(const std::vector<int64_t>& d) {
  return fmt::format("[{}]", fmt::join(d, ", "));
}

std::vector<int64_t> dims_of(const Shape& s) { return {s.dims.begin(), s.dims.begin() + s.ndim}; }

std::string model_str(const GPTConfig& c) {
  std::string s = fmt::format("{} with n_layer {}, n_head {}, n_embd {}, vocab_size {}, max_seq_len {}",
                              c.arch == ModelArch::llama ? "Llama" : "GPT-2", c.n_layer, c.n_head,
                              c.n_embd, c.vocab_size, c.max_seq_len);
  if (c.arch == ModelArch::llama)
    s += fmt::format(", n_kv_head {}, intermediate_size {}, norm_eps {}, rope_theta {}, rope_factor "
                     "{}, tie_word_embeddings {}",
                     c.kv_heads(), c.mlp_width(), c.norm_eps, c.rope_theta, c.rope_scaling.factor,
                     c.tie_word_embeddings);
  return s;
}

// The part every source shares: the whole model's table, and the check that
// a requested spec is one of its tensors (a spec of another config would
// silently read the wrong values).
class TableSource : public BaseSource {
protected:
  explicit TableSource(const GPTConfig& cfg) : cfg_(cfg), table_(model_param_table(cfg)) {}

  // Position of `spec` in the whole model's table.
  size_t find(const ParamSpec& spec) const {
    for (size_t i = 0; i < table_.size(); ++i) {
      if (table_[i].name != spec.name) continue;
      if (!(table_[i].full_shape == spec.full_shape))
        throw RankError(describe() + ": tensor '" + spec.name + "' asked for with shape " +
                            dims_str(dims_of(spec.full_shape)) + " but the model's is " +
                            dims_str(dims_of(table_[i].full_shape)),
                        MESHLM_HERE);
      return i;
    }
    throw RankError(describe() + ": tensor '" + spec.name + "' is not part of " + model_str(cfg_),
                    MESHLM_HERE);
  }

  GPTConfig cfg_;
  std::vector<ParamSpec> table_;
};

// ---------------------------------------------------------------------------
// GPT-2 initialisation
// ---------------------------------------------------------------------------

class InitSource final : public TableSource {
public:
  InitSource(const GPTConfig& cfg, uint64_t seed) : TableSource(cfg), seed_(seed) {}
  std::string describe() const override {
    return std::string(cfg_.arch == ModelArch::llama ? "Llama" : "GPT-2") +
           " initialisation, seed " + std::to_string(seed_);
  }
  std::vector<std::string> files() const override { return {}; }
  void fetch_rows(const ParamSpec& spec, int64_t row0, int64_t nrows, float* out) override {
    init_tensor_rows(cfg_, table_[find(spec)], seed_, row0, nrows, out);
  }

private:
  uint64_t seed_;
};

// ---------------------------------------------------------------------------
// Hugging Face safetensors
// ---------------------------------------------------------------------------

// The names and layouts of the file: load/hf_layout.h.
using HFLayout = hf::Layout;

// One file, or the shards of a Hugging Face directory (load/hf_dir.h): each
// tensor in exactly one of them, and in the one the index names.
class SafetensorsSource final : public TableSource {
public:
  SafetensorsSource(const std::vector<std::string>& paths, const GPTConfig& cfg,
                    std::string label, const std::map<std::string, std::string>& weight_map = {})
      : TableSource(cfg), label_(std::move(label)) {
    for (const std::string& path : paths) files_.emplace_back(path);
    for (size_t f = 0; f < files_.size(); ++f)
      for (const SafetensorsTensor& t : files_[f].tensors()) {
        const auto [it, fresh] = where_.emplace(t.name, f);
        if (!fresh)
          fail("tensor '" + t.name + "' is in both '" + files_[it->second].path() + "' and '" +
               files_[f].path() + "'");
      }
    for (const auto& [tensor, path] : weight_map) {
      const auto it = where_.find(tensor);
      if (it == where_.end() || files_[it->second].path() != path)
        fail("the index puts tensor '" + tensor + "' in '" + path + "', which does not hold it");
    }
    for (const ParamSpec& p : table_) file_names_.push_back(check(p));
  }
  std::string describe() const override { return label_; }
  std::vector<std::string> files() const override {
    std::vector<std::string> out;
    for (const SafetensorsFile& f : files_) out.push_back(f.path());
    return out;
  }

protected:
  std::string name_in_source(const ParamSpec& spec) const override { return file_names_[find(spec)]; }

  void fetch_rows(const ParamSpec& spec, int64_t row0, int64_t nrows, float* out) override {
    const size_t i = find(spec);
    const ParamSpec& p = table_[i];
    const std::string& name = file_names_[i];
    const SafetensorsFile& file_ = files_[where_.at(name)];
    const size_t rf = row_floats(p), r0 = static_cast<size_t>(row0), nr = static_cast<size_t>(nrows);
    switch (hf::layout_of(p, cfg_.arch)) {
      case HFLayout::same:
      case HFLayout::first_rows:
        file_.read_f32(name, out, r0 * rf, nr * rf);
        break;
      case HFLayout::vocab_rows: {
        // Rows past vocab_size are the padding: zeros.
        const size_t vocab = static_cast<size_t>(cfg_.vocab_size);
        const size_t real = r0 < vocab ? std::min(nr, vocab - r0) : 0;
        if (real > 0) file_.read_f32(name, out, r0 * rf, real * rf);
        std::fill(out + real * rf, out + nr * rf, 0.0f);
        break;
      }
      case HFLayout::transposed: {
        // File (in, out) -> meshlm (out, in): out[o][k] = file[k][o]. Row o
        // of meshlm's is column o of the file's: for each file row k, the
        // columns [row0, row0 + nrows) in one read.
        const size_t rows = static_cast<size_t>(p.full_shape[0]);
        std::vector<float> column(nr);
        for (size_t k = 0; k < rf; ++k) {
          file_.read_f32(name, column.data(), k * rows + r0, nr);
          for (size_t o = 0; o < nr; ++o) out[o * rf + k] = column[o];
        }
        break;
      }
    }
  }

private:
  [[noreturn]] void fail(const std::string& what) const {
    throw RankError(describe() + ": " + what, MESHLM_HERE);
  }

  // The name in the file of meshlm tensor `p`, after checking its shape
  // and dtype.
  std::string check(const ParamSpec& p) const {
    const std::vector<std::string> names = hf::file_names(p.name, cfg_.arch);
    const std::string& prefixed = names[1];
    const bool plain = where_.count(names[0]) != 0, pre = where_.count(prefixed) != 0;
    if (plain && pre)
      fail("holds both '" + p.name + "' and '" + prefixed + "'; meshlm cannot tell which to use");
    if (!plain && !pre)
      fail("no tensor '" + p.name + "' (nor '" + prefixed + "'), which " + model_str(cfg_) +
           " needs");
    const std::string& found = plain ? p.name : prefixed;
    const SafetensorsFile& file = files_[where_.at(found)];
    const SafetensorsTensor& t = file.info(found);
    // Named with its file where there are several (a directory's shards).
    const std::string tensor =
        "tensor '" + t.name + "'" + (files_.size() > 1 ? " (in '" + file.path() + "')" : "");
    const std::string model = " for " + model_str(cfg_);

    const int64_t C = cfg_.n_embd;
    const std::vector<int64_t> full = dims_of(p.full_shape);
    const std::string has = tensor + " has shape " + dims_str(t.shape);
    switch (hf::layout_of(p, cfg_.arch)) {
      case HFLayout::same:
        if (t.shape != full) fail(has + "; meshlm expects " + dims_str(full) + model);
        break;
      case HFLayout::transposed:
        if (t.shape != std::vector<int64_t>{full[1], full[0]})
          fail(has + "; meshlm expects " + dims_str({full[1], full[0]}) +
               " (Hugging Face Conv1D weights are stored (in, out))" + model);
        break;
      case HFLayout::vocab_rows:
        if (t.shape != std::vector<int64_t>{cfg_.vocab_size, C})
          fail(has + "; meshlm expects " + dims_str({cfg_.vocab_size, C}) +
               " (vocab_size rows of n_embd)" + model);
        break;
      case HFLayout::first_rows:
        if (t.shape.size() != 2 || t.shape[1] != C || t.shape[0] < cfg_.max_seq_len)
          fail(has + "; meshlm expects [" + std::to_string(cfg_.max_seq_len) + ", " +
               std::to_string(C) + "] (max_seq_len rows of n_embd; more rows are allowed and " +
               "only the first max_seq_len are used)");
        break;
    }
    if (!safetensors_dtype_is_float(t.dtype))
      fail(tensor + " has dtype '" + t.dtype +
           "' which meshlm cannot read as float (F32, F16, BF16 and F64 can be)");
    return t.name;
  }

  std::string label_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // each tensor's file
  std::vector<std::string> file_names_;  // per table entry: its name in the file
};

// ---------------------------------------------------------------------------
// meshlm HDF5
// ---------------------------------------------------------------------------

std::string dataset_path(const std::string& name) { return "params/" + name; }

class Hdf5Source final : public TableSource {
public:
  // A checkpoint's checksums verified: of the datasets i of the table with
  // i % checksum_parts == checksum_part (the ranks that open one file share
  // the hashing, each reading its part of the file once).
  Hdf5Source(const std::string& path, const GPTConfig& cfg, int checksum_part, int checksum_parts)
      : TableSource(cfg), path_(path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) fail("no such file");
    file_ = h5::open_file(path);
    if (h5::has_attr(file_, "format_version")) {
      const int64_t v = h5::read_scalar_attr<int64_t>(file_, "format_version");
      if (v != kParamsFormatVersion)
        fail("format_version " + std::to_string(v) + " is not supported (this meshlm reads " +
             std::to_string(kParamsFormatVersion) + ")");
    }
    if (h5::has_attr(file_, "vocab_size")) {
      const int64_t v = h5::read_scalar_attr<int64_t>(file_, "vocab_size");
      if (v != cfg_.vocab_size)
        fail("written for vocab_size " + std::to_string(v) + ", the model has " +
             std::to_string(cfg_.vocab_size));
    }
    const bool checkpoint = h5::exists(file_, "meta");
    if (checkpoint) {
      // A checkpoint (meshlm ckpt import's, or a run's): its /meta says the
      // model, tensors or not (tied classifier, rope, eps). A Llama's
      // max_seq_len (no position table) may be less than the file's.
      io::ckpt::Meta m = io::ckpt::read_meta(file_, path_);
      if (cfg_.arch == ModelArch::llama && m.sizes.max_seq_len >= cfg_.max_seq_len)
        m.sizes.max_seq_len = cfg_.max_seq_len;
      const std::string d = model_meta_difference(m, cfg_, "in this run");
      if (!d.empty())
        fail("its /meta is of another model: " + d + " (the [model] keys must be the file's)");
    }
    for (size_t i = 0; i < table_.size(); ++i) {
      const ParamSpec& p = table_[i];
      const std::string ds = dataset_path(p.name);
      if (!h5::exists(file_, ds))
        fail("no dataset '/" + ds + "', which " + model_str(cfg_) + " needs");
      h5::Dataset d = h5::open_dataset(file_, ds);
      std::vector<int64_t> got;
      for (hsize_t x : h5::shape(d)) got.push_back(static_cast<int64_t>(x));
      if (got != dims_of(p.full_shape))
        fail("dataset '/" + ds + "' has shape " + dims_str(got) + "; meshlm expects " +
             dims_str(dims_of(p.full_shape)));
      h5::check_type(d, H5T_NATIVE_FLOAT);
      // A checkpoint carries each dataset's XXH3-64: a damaged one is refused
      // here, as a resume refuses it, before it becomes the weights trained on.
      if (checkpoint && static_cast<int>(i % static_cast<size_t>(checksum_parts)) == checksum_part) {
        if (!h5::has_attr(d, io::ckpt::kChecksumAttr))
          fail("dataset '/" + ds + "' has no checksum (attribute " + io::ckpt::kChecksumAttr +
               "), which every dataset of a checkpoint carries");
        const uint64_t stored = h5::read_scalar_attr<uint64_t>(d, io::ckpt::kChecksumAttr);
        const uint64_t computed = io::ckpt::dataset_checksum(d);
        if (stored != computed)
          fail(fmt::format("dataset '/{}' fails its checksum: stored {:016x}, its content hashes "
                           "to {:016x} (the file is damaged; `meshlm ckpt verify` checks them all)",
                           ds, stored, computed));
      }
    }
  }
  std::string describe() const override { return "meshlm HDF5 file '" + path_ + "'"; }
  std::vector<std::string> files() const override { return {path_}; }
  void fetch_rows(const ParamSpec& spec, int64_t row0, int64_t nrows, float* out) override {
    const ParamSpec& p = table_[find(spec)];
    h5::Dataset d = h5::open_dataset(file_, dataset_path(p.name));
    h5::read_rows(d, static_cast<hsize_t>(row0), static_cast<hsize_t>(nrows), H5T_NATIVE_FLOAT, out);
  }

private:
  [[noreturn]] void fail(const std::string& what) const {
    throw RankError(describe() + ": " + what, MESHLM_HERE);
  }

  std::string path_;
  h5::File file_;
};

std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

}  // namespace

void BaseSource::read(const ParamSpec& spec, float* out) {
  read_rows(spec, 0, spec.full_shape[0], out);
}

void BaseSource::read_rows(const ParamSpec& spec, int64_t row0, int64_t nrows, float* out) {
  if (row0 < 0 || nrows < 0 || row0 + nrows > spec.full_shape[0])
    throw RankError(describe() + ": tensor '" + spec.name + "': rows [" + std::to_string(row0) +
                        ", " + std::to_string(row0 + nrows) + ") asked for; it has " +
                        std::to_string(spec.full_shape[0]),
                    MESHLM_HERE);
  fetch_rows(spec, row0, nrows, out);
  const size_t rf = row_floats(spec), first = static_cast<size_t>(row0) * rf,
               n = static_cast<size_t>(nrows) * rf;
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(out[i])) continue;
    const size_t j = first + i;
    std::string where = "index " + std::to_string(j);
    if (spec.full_shape.ndim == 2)
      where += " (row " + std::to_string(j / rf) + ", column " + std::to_string(j % rf) + ")";
    const std::string name = name_in_source(spec);
    throw RankError(describe() + ": tensor '" + name + "'" +
                        (name != spec.name ? " (meshlm's '" + spec.name + "')" : std::string()) + " holds " +
                        (std::isnan(out[i]) ? "NaN" : "an infinite value") + " at " + where +
                        ", in meshlm's layout (linear weights (out, in))",
                    MESHLM_HERE);
  }
}

std::unique_ptr<BaseSource> open_base_source(const std::string& spec_string, const GPTConfig& cfg,
                                             uint64_t seed, int checksum_part, int checksum_parts) {
  if (spec_string.empty() || spec_string == "init") return std::make_unique<InitSource>(cfg, seed);
  if (is_directory(spec_string)) {
    const HfDirectory d = read_hf_directory(spec_string);
    const GPTConfig& m = d.model;
    // Its position table may have more rows than the run's sequences.
    GPTConfig there = m;
    if (there.max_seq_len >= cfg.max_seq_len) there.max_seq_len = cfg.max_seq_len;
    if (!model_difference(there, cfg, "in this run").empty())
      throw RankError("Hugging Face directory '" + spec_string + "': its config.json is " +
                          model_str(m) + "; the run's model is " + model_str(cfg),
                      MESHLM_HERE);
    return std::make_unique<SafetensorsSource>(d.shards, cfg,
                                               "Hugging Face directory '" + spec_string + "'",
                                               d.weight_map);
  }
  const std::string ext = lower_extension(spec_string);
  if (ext == ".safetensors")
    return std::make_unique<SafetensorsSource>(std::vector<std::string>{spec_string}, cfg,
                                               "safetensors file '" + spec_string + "'");
  if (ext == ".h5" || ext == ".hdf5")
    return std::make_unique<Hdf5Source>(spec_string, cfg, checksum_part, std::max(1, checksum_parts));
  throw RankError("base weights '" + spec_string +
                      "': unknown kind of file; meshlm reads \"init\" (the model's initialisation), "
                      "*.safetensors (Hugging Face GPT-2 or Llama names), a Hugging Face model "
                      "directory "
                      "(config.json and its safetensors) or *.h5 / *.hdf5 (meshlm /params/<name> "
                      "layout)",
                  MESHLM_HERE);
}

std::string files_hash(const std::vector<std::string>& files) {
  if (files.size() == 1) return io::xxh3_128_file(files[0]);
  std::string all;
  for (const std::string& f : files) all += io::xxh3_128_file(f);
  return io::xxh3_128_hex(all.data(), all.size());
}

std::vector<std::string> base_files(const std::string& spec_string) {
  if (spec_string.empty() || spec_string == "init") return {};
  if (is_directory(spec_string)) return read_hf_directory(spec_string).shards;
  return {spec_string};
}

void write_params_h5(const std::string& path, const GPTConfig& cfg,
                     const std::vector<float>& full_params) {
  const std::vector<ParamSpec> table = model_param_table(cfg);
  const size_t n = table_numel(table);
  if (full_params.size() != n)
    throw RankError("cannot write base file '" + path + "': " + std::to_string(full_params.size()) +
                        " parameters given, " + model_str(cfg) + " has " + std::to_string(n),
                    MESHLM_HERE);
  h5::AtomicWrite out(path);
  h5::File file = h5::create_file(out.tmp_path());
  for (const ParamSpec& p : table) {
    std::vector<hsize_t> dims;
    for (int64_t d : dims_of(p.full_shape)) dims.push_back(static_cast<hsize_t>(d));
    h5::write_dataset(file, dataset_path(p.name), full_params.data() + p.offset, dims);
  }
  h5::write_scalar_attr<int32_t>(file, "format_version", kParamsFormatVersion);
  h5::write_scalar_attr<int32_t>(file, "n_layer", cfg.n_layer);
  h5::write_scalar_attr<int32_t>(file, "n_head", cfg.n_head);
  h5::write_scalar_attr<int32_t>(file, "n_embd", cfg.n_embd);
  h5::write_scalar_attr<int32_t>(file, "vocab_size", cfg.vocab_size);
  h5::write_scalar_attr<int32_t>(file, "max_seq_len", cfg.max_seq_len);
  h5::close_file(file, out.tmp_path());
  out.commit();
}

}  // namespace meshlm::load
