// The model a checkpoint holds, tensor by tensor (app/ckpt_model.h).
#include "app/ckpt_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint_file.h"
#include "io/checkpoint_meta.h"
#include "io/h5.h"
#include "load/base_loader.h"
#include "load/hf_layout.h"
#include "load/model_meta.h"
#include "model/lora.h"
#include "quant/quantize.h"

namespace meshlm::ckpt_model {

namespace h5 = io::h5;
namespace ckpt = io::ckpt;

namespace {

std::string dims_str(const std::vector<int64_t>& d) { return fmt::format("[{}]", fmt::join(d, ", ")); }
std::vector<int64_t> dims_of(const Shape& s) { return {s.dims.begin(), s.dims.begin() + s.ndim}; }

// ---------------------------------------------------------------------------
// Sources of one logical tensor, in meshlm's layout
// ---------------------------------------------------------------------------


// Opens the dataset `name` of a checkpoint after checking that it is there
// with `shape`, a float type and its checksum attribute.
h5::Dataset open_checked(hid_t file, const std::string& path, const std::string& name,
                         const std::vector<int64_t>& shape) {
  auto fail = [&](const std::string& what) {
    throw RankError("checkpoint '" + path + "': dataset '/" + name + "' " + what, MESHLM_HERE);
  };
  if (!h5::exists(file, name)) fail("is missing");
  h5::Dataset d = h5::open_dataset(file, name);
  std::vector<int64_t> got;
  for (hsize_t x : h5::shape(d)) got.push_back(static_cast<int64_t>(x));
  if (got != shape) fail("has shape " + dims_str(got) + "; the model needs " + dims_str(shape));
  h5::check_type(d, H5T_NATIVE_FLOAT);
  if (!h5::has_attr(d, ckpt::kChecksumAttr))
    fail(std::string("has no checksum attribute '") + ckpt::kChecksumAttr + "'");
  return d;
}

// open_checked, and the checksum verified before anything of the dataset is
// used: a damaged checkpoint never becomes a healthy-looking export.
h5::Dataset open_verified(hid_t file, const std::string& path, const std::string& name,
                          const std::vector<int64_t>& shape) {
  auto fail = [&](const std::string& what) {
    throw RankError("checkpoint '" + path + "': dataset '/" + name + "' " + what, MESHLM_HERE);
  };
  h5::Dataset d = open_checked(file, path, name, shape);
  const uint64_t stored = h5::read_scalar_attr<uint64_t>(d, ckpt::kChecksumAttr);
  const uint64_t computed = ckpt::dataset_checksum(d);
  if (stored != computed)
    fail(fmt::format("fails its checksum: stored {:016x}, its content hashes to {:016x} (the file "
                     "is damaged)",
                     stored, computed));
  return d;
}

class DatasetSource final : public MatrixSource {
public:
  // A 2-D dataset, or a 1-D one read as (n, 1).
  DatasetSource(h5::Dataset d, int64_t rows, int64_t cols)
      : MatrixSource(rows, cols), d_(std::move(d)) {}
  void block(int64_t r0, int64_t nr, int64_t c0, int64_t nc, float* out) override {
    h5::read_block(d_, hsize_t(r0), hsize_t(nr), hsize_t(c0), hsize_t(nc), H5T_NATIVE_FLOAT, out);
  }

private:
  h5::Dataset d_;
};

// One tensor of the frozen base as the LoRA run computed with it: quantized
// as load::fill_store quantizes it, dequantized by quant::dequantize_ref;
// with an adapter, plus s B A (s = alpha / r in float32, as
// LoraOptions::scale forms it; the sum over r in float64 and the whole
// W + s B A rounded once to float32).
class MergedSource final : public MatrixSource {
public:
  MergedSource(const load::StoreEntry& e, load::BaseSource& base)
      : MatrixSource(e.spec.full_shape[0],
                     e.spec.full_shape.ndim >= 2 ? e.spec.full_shape.numel() / e.spec.full_shape[0] : 1),
        bytes_((e.layout.total_bytes + sizeof(float) - 1) / sizeof(float)) {
    q_ = quant::qtensor_at(e.layout, reinterpret_cast<uint8_t*>(bytes_.data()));
    quant::BlockQuantizer quantizer(q_);
    const int64_t total = e.spec.full_shape[0], step = load::source_block_rows(e);
    const size_t rf = row_floats(e.spec);
    std::vector<float> rows(static_cast<size_t>(std::min(step, total)) * rf);
    for (int64_t r0 = 0; r0 < total; r0 += step) {
      const int64_t nr = std::min(step, total - r0);
      base.read_rows(e.spec, r0, nr, rows.data());
      quantizer.add(rows.data(), static_cast<size_t>(r0) * rf, static_cast<size_t>(nr) * rf);
    }
    quantizer.finish();
  }
  // The adapter of this matrix: A (r, cols), B (rows, r), whole.
  void set_adapter(std::vector<float> A, std::vector<float> B, int r, float s) {
    A_ = std::move(A);
    B_ = std::move(B);
    r_ = r;
    s_ = s;
  }
  void block(int64_t r0, int64_t nr, int64_t c0, int64_t nc, float* out) override {
    const int64_t K = cols();
    if (c0 == 0 && nc == K) {
      quant::dequantize_ref(q_, static_cast<size_t>(r0 * K), static_cast<size_t>(nr * K), out);
    } else {
      for (int64_t i = 0; i < nr; ++i)
        quant::dequantize_ref(q_, static_cast<size_t>((r0 + i) * K + c0), static_cast<size_t>(nc),
                              out + i * nc);
    }
    if (r_ == 0) return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nr; ++i) {
      const float* b = B_.data() + (r0 + i) * r_;
      for (int64_t c = 0; c < nc; ++c) {
        double acc = 0;
        for (int j = 0; j < r_; ++j) acc += double(b[j]) * double(A_[size_t(j) * K + c0 + c]);
        float& o = out[i * nc + c];
        o = static_cast<float>(double(o) + double(s_) * acc);
      }
    }
  }

private:
  std::vector<float> bytes_;  // the quantized tensor (floats: 4-byte aligned)
  quant::QTensor q_;
  std::vector<float> A_, B_;
  int r_ = 0;
  float s_ = 0;
};

}  // namespace

std::string model_str(const GPTConfig& c) {
  std::string s = fmt::format("{}, n_layer {}, n_head {}, n_embd {}, vocab_size {}, max_seq_len {}",
                              name_of(c.arch), c.n_layer, c.n_head, c.n_embd, c.vocab_size,
                              c.max_seq_len);
  if (c.arch == ModelArch::llama)
    s += fmt::format(", n_kv_head {}, intermediate_size {}", c.kv_heads(), c.mlp_width());
  return s;
}

// The configuration checked; a CollectiveError of validate() becomes this
// rank's error naming `where` (the tools run on rank 0 alone).
void validate_model(const GPTConfig& cfg, const std::string& where) {
  try {
    cfg.validate();
  } catch (const Error& e) {
    throw RankError(where + ": " + e.what(), MESHLM_HERE);
  }
}

// ---------------------------------------------------------------------------
// The checkpoint's /meta
// ---------------------------------------------------------------------------


// /meta as io::ckpt::read_meta reads it, then what its values mean here:
// the model (validated), the adapters' linear layers, the base's format.
CkptMeta read_meta(hid_t file, const std::string& path) {
  const ckpt::Meta raw = ckpt::read_meta(file, path);
  auto fail = [&](const std::string& what) -> void {
    throw RankError("checkpoint '" + path + "': " + what, MESHLM_HERE);
  };
  CkptMeta m;
  m.path = path;
  m.cfg = load::model_of_meta(raw);
  validate_model(m.cfg, "checkpoint '" + path + "'");
  m.step = raw.step;
  m.hf_config = raw.hf_config;
  m.lora = raw.lora.has_value();
  if (!m.lora) return m;
  const ckpt::LoraMeta& l = *raw.lora;
  m.lora_rank = static_cast<int>(l.rank);
  m.lora_alpha = l.alpha;
  m.targets_text = l.targets;
  std::string bad;
  const ModelArch arch = m.cfg.arch;
  if (!parse_slots(m.targets_text, m.targets, bad) || m.targets.empty() ||
      !m.targets.outside(arch).empty()) {
    // The reason, then the message (formatted in steps: GCC 12 warns
    // -Wrestrict, wrongly, on the one expression).
    const std::string why =
        !bad.empty() ? fmt::format("'{}' is none", log::printable(bad))
        : m.targets.empty()
            ? std::string("empty")
            : fmt::format("'{}' is none of {}'s", slots_text(m.targets.outside(arch)), name_of(arch));
    fail(fmt::format("/meta lora_targets '{}' names no linear layers ({}; {})",
                     log::printable(m.targets_text), why, slots_text(LinearSlots::of(arch))));
  }
  m.quant_type_text = l.quant_type;
  const std::optional<quant::QuantType> qt = enum_from_name<quant::QuantType>(m.quant_type_text);
  if (!qt)
    fail("/meta quant_type '" + log::printable(m.quant_type_text) + "' is not one of " +
         enum_choices<quant::QuantType>(", "));
  m.quant_type = *qt;
  m.quant_base = l.quant_base;
  m.base_hash = l.base_hash;
  if (!raw.seed) fail("/meta has no attribute 'seed'");
  m.seed = static_cast<uint64_t>(*raw.seed);
  return m;
}

// The table of the adapters the checkpoint holds (names "<matrix>.lora_A",
// ".lora_B", logical shapes, in the base table's order).
std::vector<ParamSpec> adapter_table(const CkptMeta& m) {
  LoraOptions o;
  o.enabled = true;
  o.rank = m.lora_rank;
  o.alpha = static_cast<float>(m.lora_alpha);
  o.targets = m.targets;
  return lora_param_table(m.cfg, ModelShard{}, o);
}

std::unique_ptr<MatrixSource> dataset_source(hid_t file, const std::string& path,
                                             const std::string& name, const Shape& shape) {
  h5::Dataset d = open_verified(file, path, name, dims_of(shape));
  const int64_t rows = shape.dims[0], cols = shape.ndim >= 2 ? shape.numel() / rows : 1;
  MESHLM_CHECK(shape.ndim <= 2, "checkpoint tensors are vectors or matrices");
  return std::make_unique<DatasetSource>(std::move(d), rows, cols);
}

std::vector<ModelTensor> model_tensors(hid_t file, const CkptMeta& m) {
  std::vector<ModelTensor> out;
  for (const ParamSpec& p : model_param_table(m.cfg)) {
    const std::string ds = ckpt::params_path(p.name);
    open_checked(file, m.path, ds, dims_of(p.full_shape));
    out.push_back({p, [file, &m, ds, p] { return dataset_source(file, m.path, ds, p.full_shape); }});
  }
  return out;
}

// A checkpoint of another configuration would otherwise lose adapters
// silently.
void check_adapters(hid_t file, const CkptMeta& m, const std::vector<ParamSpec>& adapters) {
  std::set<std::string> expected;
  for (const ParamSpec& p : adapters) expected.insert(ckpt::lora_path(p.name));
  for (const std::string& ds : ckpt::list_datasets(file))
    if (ds.rfind("lora/", 0) == 0 && !expected.count(ds))
      throw RankError("checkpoint '" + m.path + "': dataset '/" + ds +
                          "' is not an adapter of /meta lora_targets '" + m.targets_text + "'",
                      MESHLM_HERE);
  for (const ParamSpec& p : adapters)
    open_checked(file, m.path, ckpt::lora_path(p.name), dims_of(p.full_shape));
}

namespace {

// One adapter whole (verified, finite).
std::vector<float> read_adapter(hid_t file, const CkptMeta& m, const ParamSpec& p) {
  std::vector<float> v(p.numel());
  std::unique_ptr<MatrixSource> d = dataset_source(file, m.path, ckpt::lora_path(p.name), p.full_shape);
  d->block(0, d->rows(), 0, d->cols(), v.data());
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      throw RankError("checkpoint '" + m.path + "': adapter '" + p.name + "' holds " +
                          (std::isnan(v[i]) ? "NaN" : "an infinite value") + " at index " +
                          std::to_string(i),
                      MESHLM_HERE);
  return v;
}

}  // namespace

// The base's store format (load::make_manifest: matrices in quant_type,
// vectors f32).
std::vector<ModelTensor> merged_tensors(hid_t file, const CkptMeta& m,
                                        const std::vector<ParamSpec>& adapters,
                                        load::BaseSource& base) {
  // The adapters of each matrix: <matrix>.lora_A and <matrix>.lora_B.
  std::map<std::string, std::pair<ParamSpec, ParamSpec>> adapter_of;
  for (const ParamSpec& p : adapters) {
    const std::string matrix = p.name.substr(0, p.name.rfind(".lora_"));
    (p.role == ParamRole::lora_a ? adapter_of[matrix].first : adapter_of[matrix].second) = p;
  }
  // LoraOptions::scale(): alpha / r in float32, as the forward uses it.
  const float s = static_cast<float>(m.lora_alpha) / static_cast<float>(m.lora_rank);
  std::vector<ModelTensor> out;
  for (const load::StoreEntry& e : load::make_manifest(m.cfg, m.quant_type).entries) {
    const ParamSpec& p = e.spec;
    std::optional<std::pair<ParamSpec, ParamSpec>> ab;
    if (adapter_of.count(p.name)) ab = adapter_of.at(p.name);
    out.push_back({p, [file, &m, &base, e, ab, s] {
                     auto src = std::make_unique<MergedSource>(e, base);
                     if (ab)
                       src->set_adapter(read_adapter(file, m, ab->first),
                                        read_adapter(file, m, ab->second), m.lora_rank, s);
                     return std::unique_ptr<MatrixSource>(std::move(src));
                   }});
  }
  return out;
}

std::unique_ptr<load::BaseSource> open_lora_base(const CkptMeta& m, const std::string& base,
                                                 const std::string& tool, std::FILE* notes) {
  const std::string where = "checkpoint '" + m.path + "'";
  if (base.empty() || base == "init") {
    if (!m.base_hash.empty())
      throw RankError(where + " was trained on a base file (/meta base_hash " + m.base_hash +
                          ", quant_base '" + m.quant_base +
                          "'), not on the model's initialisation; name that file with --base",
                      MESHLM_HERE);
    log::write_line(notes, fmt::format("# {}: base = the model's initialisation, seed {}\n", tool, m.seed));
    return load::open_base_source(base, m.cfg, m.seed);
  }
  std::error_code ec;
  if (!std::filesystem::exists(base, ec))
    throw RankError(where + ": its base '" + base + "' does not exist" +
                        (base == m.quant_base ? " (the path is /meta quant_base, relative to the "
                                                "training run's directory; name the file with --base)"
                                              : ""),
                    MESHLM_HERE);
  if (m.base_hash.empty()) {
    log::warn("{} was trained on the model's initialisation (/meta base_hash is empty); merging onto "
              "'{}' as --base asks",
              where, base);
  } else {
    const std::string hash = load::files_hash(load::base_files(base));
    if (hash != m.base_hash)
      throw RankError(where + ": the base '" + base + "' is not the one it was trained on: its " +
                          "XXH3-128 is " + hash + ", /meta base_hash is " + m.base_hash +
                          " (quant_base '" + m.quant_base + "')",
                      MESHLM_HERE);
    log::write_line(notes, fmt::format("# {}: base = {} (XXH3-128 {} matches /meta base_hash)\n", tool, base, hash));
  }
  return load::open_base_source(base, m.cfg, m.seed);
}

GPTConfig infer_gpt2_model(const io::SafetensorsFile& f, int heads) {
  const std::string in = "safetensors file '" + f.path() + "'";
  auto find = [&](const std::string& name) -> const io::SafetensorsTensor& {
    const std::vector<std::string> names = load::hf::file_names(name, ModelArch::gpt2);
    for (const std::string& n : names)
      if (f.has(n)) return f.info(n);
    throw RankError(in + ": no tensor '" + name + "' (nor '" + names[1] +
                        "'), which a GPT-2 model has; is this a GPT-2 file?",
                    MESHLM_HERE);
  };
  GPTConfig c;
  const io::SafetensorsTensor& wte = find("wte.weight");
  const io::SafetensorsTensor& wpe = find("wpe.weight");
  for (const io::SafetensorsTensor* t : {&wte, &wpe})
    if (t->shape.size() != 2 || t->shape[0] < 1 || t->shape[1] < 1 ||
        t->shape[0] > std::numeric_limits<int>::max() || t->shape[1] > std::numeric_limits<int>::max())
      throw RankError(in + ": tensor '" + t->name + "' has shape " + dims_str(t->shape) +
                          "; a GPT-2 embedding is (rows, n_embd)",
                      MESHLM_HERE);
  c.vocab_size = static_cast<int>(wte.shape[0]);
  c.n_embd = static_cast<int>(wte.shape[1]);
  c.max_seq_len = static_cast<int>(wpe.shape[0]);
  c.n_head = heads;
  std::set<long long> layers;
  for (const io::SafetensorsTensor& t : f.tensors())
    if (const std::optional<long long> l = load::hf::block_of(t.name, ModelArch::gpt2)) layers.insert(*l);
  if (layers.empty())
    throw RankError(in + ": no transformer blocks (tensors h.0.*); is this a GPT-2 file?", MESHLM_HERE);
  const long long top = *layers.rbegin();
  for (long long l = 0; l <= top; ++l)
    if (!layers.count(l))
      throw RankError(in + ": it holds block h." + std::to_string(top) + " but no tensor of block h." +
                          std::to_string(l),
                      MESHLM_HERE);
  c.n_layer = static_cast<int>(top + 1);
  return c;
}

}  // namespace meshlm::ckpt_model
