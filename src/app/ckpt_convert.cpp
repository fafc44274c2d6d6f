// `meshlm ckpt export` and `meshlm ckpt import` (app/ckpt_convert.h).
//
// export: a checkpoint (docs/formats.md, "Checkpoints") to a Hugging Face
// model directory (config.json and sharded safetensors) or one safetensors
// file, in the names and layout of load/hf_layout.h. Each output tensor is made a block of its rows at a
// time (at most kBlockFloats floats) from a MatrixSource (app/ckpt_model.h, shared with
// meshlm generate), a view of one
// logical tensor in meshlm's layout (linear weights (out, in)):
//
//   * a dataset of the checkpoint (/params/<name>, /lora/<matrix>/{A,B}),
//     its checksum verified before a byte of it is exported;
//   * under --merge, the frozen base of a LoRA run as that run computed with
//     it: read from its source (load::open_base_source), quantized in
//     quant_type exactly as load::fill_store does (the same manifest, the
//     same BlockQuantizer over the whole logical tensor, so nf4's per-tensor
//     offset is the same) and dequantized by quant::dequantize_ref, the
//     function the training forward's dequantize_rows calls; plus
//     (alpha / r) B A for an adapted matrix. Only this tensor's quantized
//     bytes (and its A and B) are held while it is written.
//
//   Hugging Face's layout from meshlm's: GPT-2's Conv1D weights (c_attn,
//   c_proj, c_fc) are written (in, out), so a block of output rows is a
//   block of columns of meshlm's (out, in) tensor, transposed; token
//   embeddings and lm_head are cut to their vocab_size rows (the padding
//   dropped); every other tensor as it is.
//
// import: a Hugging Face directory (GPT-2 or Llama) or GPT-2 safetensors
// file (read through load::open_base_source, which transposes the Conv1D
// weights, pads the vocabulary rows and refuses NaN and infinities) to a
// checkpoint with /params only, written serially a block of rows at a time,
// each dataset hashed as it is written.
//
// Both write under a temporary name and rename when complete (an error at
// any tensor leaves nothing), and replace only a file (or directory) of
// their own kind.
#include "app/ckpt_convert.h"
#include "app/ckpt_model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/suggest.h"
#include "core/timer.h"
#include "io/checkpoint_file.h"
#include "io/checkpoint_meta.h"
#include "io/h5.h"
#include "io/hash.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "load/base_loader.h"
#include "load/base_source.h"
#include "load/hf_dir.h"
#include "load/hf_layout.h"
#include "load/model_meta.h"
#include "model/gpt_config.h"
#include "model/lora.h"
#include "model/param_table.h"
#include "quant/quantize.h"

namespace meshlm {

namespace {

namespace h5 = io::h5;
namespace ckpt = io::ckpt;
// The model of a checkpoint tensor by tensor, the /meta it is read from, the
// LoRA base merged (app/ckpt_model.h).
using ckpt_model::CkptMeta;
using ckpt_model::MatrixSource;
using ckpt_model::ModelTensor;
using ckpt_model::dataset_source;
using ckpt_model::model_str;
using ckpt_model::validate_model;

// A block of output rows holds at most this many floats (4 MiB), and so
// does a block of a transposed tensor's source columns.
constexpr size_t kBlockFloats = size_t{1} << 20;
// GPT-2's head count, the import's default: a safetensors file's shapes do
// not tell it.
constexpr int kDefaultHeads = 12;
// A directory's shards hold at most this many MB (10^6 bytes) each, as
// transformers' save_pretrained by default ("5GB").
constexpr int kDefaultShardMB = 5000;

// ---------------------------------------------------------------------------
// Command lines
// ---------------------------------------------------------------------------

const char* kExportUsage =
    "usage: meshlm ckpt export CKPT.h5 -o OUT.safetensors|DIR [--dtype fp32|bf16|fp16]\n"
    "                          [--shard-mb X] [--merge] [--base FILE|DIR] [--format safetensors]\n"
    "\n"
    "Writes the model of a checkpoint (GPT-2 or Llama) in Hugging Face's layout:\n"
    "\n"
    "  -o DIR             (any name not ending in .safetensors) a Hugging Face model\n"
    "                     directory: config.json (GPT2LMHeadModel or LlamaForCausalLM)\n"
    "                     and model.safetensors, or shards model-0000K-of-0000N.safetensors\n"
    "                     with model.safetensors.index.json; names as transformers saves\n"
    "                     them (GPT-2: GPT2Model's; Llama: \"model.\" prefixed, lm_head.weight).\n"
    "                     Written whole under a temporary name, then renamed; a directory\n"
    "                     there is replaced only if it is empty or meshlm exported it, and\n"
    "                     what else it holds (a tokenizer, a README) is kept\n"
    "  -o OUT.safetensors one file: GPT-2 as GPT2Model's state dict (wte.weight,\n"
    "                     h.0.attn.c_attn.weight, ...), a Llama under its directory names;\n"
    "                     replaced only if it is a safetensors file\n"
    "\n"
    "GPT-2's Conv1D weights (c_attn, c_proj, c_fc) are stored (in, out), token\n"
    "embeddings and lm_head cut to vocab_size rows; __metadata__ holds format = pt\n"
    "and the checkpoint's step, path and model.\n"
    "\n"
    "  --dtype T          bf16 (a directory's default), fp32 (one file's default; exact)\n"
    "                     or fp16: rounded to nearest, ties to even; a value past fp16's\n"
    "                     range is an error\n"
    "  --shard-mb X       a directory's shards hold at most X MB (10^6 bytes; 0.5 is\n"
    "                     half a MB) each (default 5000, as transformers); a larger\n"
    "                     tensor is a shard alone\n"
    "  --format F         safetensors (the only one)\n"
    "  --merge            LoRA checkpoint: write the whole model, each adapted matrix\n"
    "                     W + (alpha/r) B A, W the base as the run used it: every\n"
    "                     matrix (embeddings too) quantized in quant_type and\n"
    "                     dequantized again, vectors as they are.\n"
    "                     Without it a LoRA checkpoint exports its adapters to one file\n"
    "                     (<matrix>.lora_A (r, in), <matrix>.lora_B (out, r))\n"
    "  --base FILE|DIR    under --merge: the base instead of /meta quant_base (\"\" is the\n"
    "                     model's initialisation from /meta seed); its XXH3-128 must\n"
    "                     match /meta base_hash when that is set\n";

const char* kImportUsage =
    "usage: meshlm ckpt import DIR -o OUT.h5\n"
    "       meshlm ckpt import IN.safetensors -o OUT.h5 [--n_head N] [--n_layer N]\n"
    "                          [--n_embd N] [--vocab_size N] [--max_seq_len N]\n"
    "\n"
    "Writes a Hugging Face model as a meshlm checkpoint: /params in meshlm's layout\n"
    "(linear weights (out, in), token embeddings and lm_head padded to a multiple of\n"
    "64 rows), checksums, step 0, no optimizer state. The file is also a meshlm base\n"
    "file (quant.base = OUT.h5).\n"
    "\n"
    "  DIR                a Hugging Face directory (GPT-2 or Llama): config.json gives\n"
    "                     the model, model.safetensors or the shards of its index the\n"
    "                     weights (quant.base = DIR reads the same way)\n"
    "  IN.safetensors     one GPT-2 file (GPT2Model's names, \"transformer.\" prefixed or\n"
    "                     not); its shapes give the model, with:\n"
    "  -o, --output FILE  the checkpoint to write (replaced only if it is a meshlm checkpoint)\n"
    "  --n_head N         attention heads: the shapes do not tell them. Default: the\n"
    "                     file's __metadata__ meshlm.n_head when meshlm wrote it, else\n"
    "                     12 (GPT-2's)\n"
    "  --n_layer, --n_embd, --vocab_size, --max_seq_len N\n"
    "                     by default read from the shapes: the h.N blocks, wte (vocab_size,\n"
    "                     n_embd), wpe (max_seq_len rows). Each may also be written\n"
    "                     --model.KEY\n";

// Options of one tool: "--key value" or "--key=value" for those that take a
// value, "--key" for flags; "-o" is "--output". The last of a repeated
// option wins, as on meshlm train's command line.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> values;
  std::set<std::string> flags;
  bool help = false;
};

Args parse_args(const std::vector<std::string>& args, const std::string& tool,
                const std::set<std::string>& with_value, const std::set<std::string>& flags) {
  Args out;
  auto bad = [&](const std::string& what) {
    throw RankError(what + " (meshlm ckpt " + tool + " --help)", MESHLM_HERE);
  };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--help" || a == "-h") {
      out.help = true;
      continue;
    }
    if (a == "-o") a = "--output";
    if (a.size() < 2 || a[0] != '-' || a == "-") {
      out.positional.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    const size_t eq = key.find('=');
    const bool has_eq = eq != std::string::npos;
    if (has_eq) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    if (a.rfind("--", 0) != 0) bad("unknown option '" + log::printable(a) + "'");
    if (flags.count(key)) {
      if (has_eq) bad("--" + key + " takes no value");
      out.flags.insert(key);
    } else if (with_value.count(key)) {
      if (!has_eq) {
        if (i + 1 >= args.size()) bad("--" + key + " needs a value");
        value = args[++i];
      }
      out.values[key] = value;
    } else {
      std::vector<std::string> known;
      for (const std::set<std::string>* names : {&flags, &with_value})
        for (const std::string& n : *names) known.push_back("--" + n);
      bad("unknown option '" + log::printable(a) + "'" + did_you_mean("--" + key, known));
    }
  }
  return out;
}

// A positive int from an option's text.
int positive_int(const std::string& key, const std::string& text) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || v < 1 || v > std::numeric_limits<int>::max())
    throw RankError("--" + key + " must be a positive integer (got '" +
                        log::printable(text) + "')",
                    MESHLM_HERE);
  return static_cast<int>(v);
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

std::vector<int64_t> dims_of(const Shape& s) { return {s.dims.begin(), s.dims.begin() + s.ndim}; }

// ---------------------------------------------------------------------------
// Writing the safetensors file
// ---------------------------------------------------------------------------

// How a tensor of the file sits in its meshlm source: load/hf_layout.h
// (wpe's first_rows is all of meshlm's rows here).
using HFLayout = load::hf::Layout;

struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;  // in the file
  HFLayout layout = HFLayout::same;
  std::function<std::unique_ptr<MatrixSource>()> open;  // called when its turn comes
};

enum class OutDType { fp32, bf16, fp16 };

struct DTypeInfo {
  OutDType type;
  const char* option;       // --dtype
  const char* safetensors;  // the header's dtype
  const char* torch;        // config.json's torch_dtype
  size_t bytes;
};
constexpr DTypeInfo kOutDTypes[] = {
    {OutDType::fp32, "fp32", "F32", "float32", 4},
    {OutDType::bf16, "bf16", "BF16", "bfloat16", 2},
    {OutDType::fp16, "fp16", "F16", "float16", 2},
};

// Writes every tensor of `tensors` in turn, a block of rows at a time.
void write_safetensors(const std::string& out_path, const std::vector<OutTensor>& tensors,
                       const DTypeInfo& dt, const std::map<std::string, std::string>& metadata,
                       const std::string& source) {
  std::vector<io::SafetensorsEntry> entries;
  for (const OutTensor& t : tensors) entries.push_back({t.name, dt.safetensors, t.shape});
  io::SafetensorsWriter w(out_path, entries, metadata);

  std::vector<float> rows, cols;
  std::vector<unsigned char> bytes;
  ProgressBar bar("export", tensors.size());
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const OutTensor& t = tensors[ti];
    std::unique_ptr<MatrixSource> src = t.open();
    const int64_t R = t.shape[0];
    int64_t row_len = 1;
    for (size_t d = 1; d < t.shape.size(); ++d) row_len *= t.shape[d];
    const int64_t per_block =
        std::max<int64_t>(1, std::min<int64_t>(R, static_cast<int64_t>(kBlockFloats) / row_len));
    rows.resize(static_cast<size_t>(per_block * row_len));
    bytes.resize(rows.size() * dt.bytes);
    for (int64_t r0 = 0; r0 < R; r0 += per_block) {
      const int64_t nr = std::min(per_block, R - r0);
      const size_t n = static_cast<size_t>(nr * row_len);
      if (t.layout == HFLayout::transposed) {
        // File rows [r0, r0 + nr) are meshlm's columns: read them for all
        // of meshlm's rows (row_len of them), then transpose.
        cols.resize(n);
        src->block(0, row_len, r0, nr, cols.data());
        for (int64_t o = 0; o < row_len; ++o)
          for (int64_t k = 0; k < nr; ++k) rows[k * row_len + o] = cols[o * nr + k];
      } else {
        src->block(r0, nr, 0, row_len, rows.data());
      }
      for (size_t i = 0; i < n; ++i) {
        const float x = rows[i];
        const size_t at = static_cast<size_t>(r0 * row_len) + i;
        auto where = [&] {
          return t.shape.size() == 2 ? fmt::format("row {}, column {}", at / row_len, at % row_len)
                                     : fmt::format("index {}", at);
        };
        if (!std::isfinite(x))
          throw RankError(fmt::format("{}: tensor '{}' holds {} at {} (in the exported layout); "
                                      "nothing was written",
                                      source, t.name, std::isnan(x) ? "NaN" : "an infinite value",
                                      where()),
                          MESHLM_HERE);
        unsigned char* b = bytes.data() + i * dt.bytes;
        switch (dt.type) {
          case OutDType::fp32: {
            const uint32_t u = std::bit_cast<uint32_t>(x);
            for (int k = 0; k < 4; ++k) b[k] = static_cast<unsigned char>(u >> (8 * k));
            break;
          }
          case OutDType::bf16:
          case OutDType::fp16: {
            const uint16_t h = dt.type == OutDType::bf16 ? io::f32_to_bf16(x) : io::f32_to_f16(x);
            if (dt.type == OutDType::fp16 && (h & 0x7fffu) == 0x7c00u)
              throw RankError(fmt::format("{}: tensor '{}' holds {} at {}, beyond fp16's range "
                                          "(largest 65504); export as bf16 or fp32. Nothing was "
                                          "written",
                                          source, t.name, x, where()),
                              MESHLM_HERE);
            b[0] = static_cast<unsigned char>(h);
            b[1] = static_cast<unsigned char>(h >> 8);
            break;
          }
        }
      }
      w.write(bytes.data(), n * dt.bytes);
    }
    bar.update(ti + 1, t.name);
  }
  bar.finish();
  w.commit();
}

// Removes a directory tree when it goes out of scope, unless released.
class TreeGuard {
public:
  explicit TreeGuard(std::string path) : path_(std::move(path)) {}
  ~TreeGuard() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TreeGuard(const TreeGuard&) = delete;
  TreeGuard& operator=(const TreeGuard&) = delete;
  void release() { path_.clear(); }

private:
  std::string path_;
};

void write_text_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  const bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f && std::fclose(f) != 0) f = nullptr;
  if (!ok || !f) throw RankError("cannot write '" + path + "'", MESHLM_HERE);
}

// The shards of a Hugging Face directory: consecutive tensors, a new shard
// where the next tensor would take one past `shard_bytes` (a tensor larger
// than that alone in its shard), as transformers' save_pretrained splits.
std::vector<std::vector<OutTensor>> split_shards(const std::vector<OutTensor>& tensors,
                                                 const DTypeInfo& dt, uint64_t shard_bytes) {
  std::vector<std::vector<OutTensor>> shards(1);
  uint64_t used = 0;
  for (const OutTensor& t : tensors) {
    uint64_t bytes = dt.bytes;
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    if (!shards.back().empty() && used + bytes > shard_bytes) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(t);
    used += bytes;
  }
  return shards;
}

// A Hugging Face model directory at `out`: config.json (for `cfg`, with the
// `kept` keys of the model's own, marked as meshlm's with `origin`), model.safetensors or the shards of
// model.safetensors.index.json. Written whole in a directory of a temporary
// name, then renamed onto `out`; what was at `out` is replaced only when it
// is an empty directory or one that meshlm exported, and the files there
// that meshlm does not write are kept.
void write_hf_directory(const std::string& out, const std::vector<OutTensor>& tensors,
                        const DTypeInfo& dt, const std::map<std::string, std::string>& metadata,
                        const GPTConfig& cfg, const std::string& kept, uint64_t shard_bytes,
                        const std::map<std::string, std::string>& origin, const std::string& source) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool there = fs::exists(out, ec);
  if (there) {
    if (!fs::is_directory(out, ec))
      throw RankError("output '" + out + "': a file is there, and it is not a safetensors file "
                          "that meshlm may replace (an output ending in .safetensors is written "
                          "as one file, any other as a Hugging Face directory)",
                      MESHLM_HERE);
    if (!fs::is_empty(out, ec) && !load::written_by_meshlm(out))
      throw RankError("Hugging Face directory '" + out + "': a directory meshlm did not export "
                          "is there; meshlm replaces only its own (remove it or name another)",
                      MESHLM_HERE);
  }
  remove_stale_temp_files(out);
  const std::string tmp = temp_name_for(out);
  if (!fs::create_directory(tmp, ec) || ec)
    throw RankError("Hugging Face directory '" + out + "': cannot make '" + tmp + "' (" +
                        ec.message() + ")",
                    MESHLM_HERE);
  TreeGuard guard(tmp);
  const std::vector<std::vector<OutTensor>> shards = split_shards(tensors, dt, shard_bytes);
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shards.size() == 1 ? std::string(load::kHfWeights)
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                                              i + 1, shards.size());
    log::info("# ckpt export: shard {} of {}: {} ({} tensors)", i + 1, shards.size(), name,
              shards[i].size());
    write_safetensors((fs::path(tmp) / name).string(), shards[i], dt, metadata, source);
    for (const OutTensor& t : shards[i]) {
      uint64_t bytes = dt.bytes;
      for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
      total += bytes;
      weight_map[t.name] = name;
    }
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text_file((fs::path(tmp) / load::kHfIndex).string(), index.dump(2) + "\n");
  }
  const std::string config = (fs::path(tmp) / load::kHfConfig).string();
  write_text_file(config, load::hf_config_json(cfg, dt.torch, origin, kept));
  sync_file_and_dir(config);
  if (there) {
    // What the old directory holds besides meshlm's export (a tokenizer, a
    // README) moves into the new one.
    static const std::regex ours(
        R"(^(config\.json|model\.safetensors|model\.safetensors\.index\.json|model-\d{5}-of-\d{5}\.safetensors)$)");
    std::vector<std::string> kept;
    for (const fs::directory_entry& e : fs::directory_iterator(out, ec)) {
      const std::string name = e.path().filename().string();
      if (std::regex_match(name, ours)) continue;
      fs::rename(e.path(), fs::path(tmp) / name, ec);
      if (ec) {
        const std::string why = ec.message();
        for (const std::string& k : kept) fs::rename(fs::path(tmp) / k, fs::path(out) / k, ec);
        throw RankError("Hugging Face directory '" + out + "': cannot keep '" + name + "' (" + why +
                            "); nothing was replaced",
                        MESHLM_HERE);
      }
      kept.push_back(name);
    }
    if (!kept.empty())
      log::info("# ckpt export: kept what meshlm does not write: {}", fmt::join(kept, ", "));
    const std::string old = temp_name_for(out);
    fs::rename(out, old, ec);
    if (ec)
      throw RankError("Hugging Face directory '" + out + "': cannot move the old one aside (" +
                          ec.message() + ")",
                      MESHLM_HERE);
    fs::rename(tmp, out, ec);
    if (ec) {
      std::error_code back;
      fs::rename(old, out, back);
      throw RankError("Hugging Face directory '" + out + "': cannot rename '" + tmp + "' onto it (" +
                          ec.message() + ")",
                      MESHLM_HERE);
    }
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp, out, ec);
    if (ec)
      throw RankError("Hugging Face directory '" + out + "': cannot rename '" + tmp + "' onto it (" +
                          ec.message() + ")",
                      MESHLM_HERE);
  }
  guard.release();
  sync_file_and_dir((fs::path(out) / load::kHfConfig).string());
}

// The model's tensors under their names in the file, meshlm's names for now
// (ckpt_export renames them for a directory or a Llama).
std::vector<OutTensor> out_tensors(const std::vector<ModelTensor>& model, const GPTConfig& cfg) {
  std::vector<OutTensor> out;
  for (const ModelTensor& t : model)
    out.push_back({t.spec.name, load::hf::file_shape(t.spec, cfg), load::hf::layout_of(t.spec, cfg.arch),
                   t.open});
  return out;
}

// The adapters as stored: <matrix>.lora_A (r, in), <matrix>.lora_B (out, r).
std::vector<OutTensor> adapter_tensors(hid_t file, const CkptMeta& m,
                                       const std::vector<ParamSpec>& adapters) {
  std::vector<OutTensor> out;
  for (const ParamSpec& p : adapters) {
    const std::string ds = ckpt::lora_path(p.name);
    out.push_back({p.name, dims_of(p.full_shape), HFLayout::same, [file, &m, ds, p] {
                     return dataset_source(file, m.path, ds, p.full_shape);
                   }});
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// export
// ---------------------------------------------------------------------------

namespace {

// meshlm ckpt export's command line.
struct ExportOptions {
  std::string in, out, base;
  bool directory = false;  // a Hugging Face directory (else one safetensors file)
  bool merge = false, base_given = false;
  const DTypeInfo* dt = nullptr;
  uint64_t shard_bytes = 0;
};

ExportOptions export_options(const Args& a) {
  auto bad = [](const std::string& what) {
    throw RankError(what + " (meshlm ckpt export --help)", MESHLM_HERE);
  };
  ExportOptions o;
  if (a.positional.size() != 1)
    bad(a.positional.empty() ? "no checkpoint named" : "one checkpoint at a time");
  o.in = a.positional[0];
  if (!a.values.count("output")) bad("no output (-o OUT.safetensors or -o DIR)");
  o.out = a.values.at("output");
  while (o.out.size() > 1 && o.out.back() == '/') o.out.pop_back();
  std::string ext = std::filesystem::path(o.out).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  o.directory = ext != ".safetensors";
  const std::string format = a.values.count("format") ? a.values.at("format") : "safetensors";
  if (format != "safetensors") bad("--format '" + log::printable(format) + "': only safetensors");
  const std::string dtype =
      a.values.count("dtype") ? a.values.at("dtype") : (o.directory ? "bf16" : "fp32");
  for (const DTypeInfo& d : kOutDTypes)
    if (dtype == d.option) o.dt = &d;
  if (!o.dt) bad("--dtype '" + log::printable(dtype) + "': fp32, bf16 or fp16");
  double shard_mb = kDefaultShardMB;
  if (a.values.count("shard-mb")) {
    const std::string& text = a.values.at("shard-mb");
    size_t used = 0;
    try {
      shard_mb = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() || !(shard_mb > 0) || shard_mb > 1e9)
      bad("--shard-mb must be a positive number of MB (got '" + log::printable(text) + "')");
    if (!o.directory) bad("--shard-mb is for a directory output");
  }
  o.shard_bytes = std::max<uint64_t>(1, static_cast<uint64_t>(shard_mb * 1e6));
  o.merge = a.flags.count("merge") != 0;
  o.base_given = a.values.count("base") != 0;
  if (o.base_given) o.base = a.values.at("base");
  if (o.base_given && !o.merge) bad("--base is for --merge");
  if (same_file(o.in, o.out)) bad("the output '" + o.out + "' is the checkpoint itself");
  return o;
}

}  // namespace

int ckpt_export(const std::vector<std::string>& args) {
  const Args a =
      parse_args(args, "export", {"output", "dtype", "format", "base", "shard-mb"}, {"merge"});
  if (a.help) {
    std::fputs(kExportUsage, stdout);
    return 0;
  }
  const ExportOptions o = export_options(a);
  auto bad = [](const std::string& what) {
    throw RankError(what + " (meshlm ckpt export --help)", MESHLM_HERE);
  };
  const std::string& in = o.in;
  const std::string& out = o.out;
  const DTypeInfo* dt = o.dt;

  const double t0 = now_seconds();
  const std::string kind = non_regular_kind(in);
  if (!kind.empty()) throw RankError("checkpoint '" + in + "' is " + kind, MESHLM_HERE);
  if (!h5::is_hdf5_file(in))
    throw RankError("checkpoint '" + in + "': " +
                        (std::filesystem::exists(in) ? "not an HDF5 file" : "no such file"),
                    MESHLM_HERE);
  h5::File file = h5::open_file(in);
  const CkptMeta m = ckpt_model::read_meta(file, in);
  if (o.merge && !m.lora)
    bad("--merge is for LoRA checkpoints; '" + in + "' is a full-training one (export it without --merge)");
  if (m.lora && !o.merge && o.directory)
    bad("a LoRA checkpoint's adapters are exported to one file (-o OUT.safetensors); --merge "
        "exports the whole model, to a directory too");

  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"meshlm.source", in},
      {"meshlm.step", std::to_string(m.step)},
      {"meshlm.arch", name_of(m.cfg.arch)},
      {"meshlm.n_layer", std::to_string(m.cfg.n_layer)},
      {"meshlm.n_head", std::to_string(m.cfg.n_head)},
      {"meshlm.n_embd", std::to_string(m.cfg.n_embd)},
      {"meshlm.vocab_size", std::to_string(m.cfg.vocab_size)},
      {"meshlm.max_seq_len", std::to_string(m.cfg.max_seq_len)},
      {"meshlm.dtype", dt->option},
  };
  std::vector<OutTensor> tensors;
  std::unique_ptr<load::BaseSource> base;
  std::string content;
  if (!m.lora) {
    content = "model";
    tensors = out_tensors(ckpt_model::model_tensors(file, m), m.cfg);
  } else {
    meta["meshlm.lora_rank"] = std::to_string(m.lora_rank);
    meta["meshlm.lora_alpha"] = fmt::format("{}", m.lora_alpha);
    meta["meshlm.lora_targets"] = m.targets_text;
    meta["meshlm.quant_type"] = m.quant_type_text;
    meta["meshlm.base_hash"] = m.base_hash;
    const std::vector<ParamSpec> adapters = ckpt_model::adapter_table(m);
    ckpt_model::check_adapters(file, m, adapters);
    if (!o.merge) {
      content = "lora adapters";
      meta["meshlm.base"] = m.quant_base;
      tensors = adapter_tensors(file, m, adapters);
    } else {
      content = "model, lora adapters merged";
      const std::string base_path = o.base_given ? o.base : m.quant_base;
      if (!base_path.empty() && base_path != "init" && same_file(base_path, out))
        bad("the output '" + out + "' is the base itself");
      meta["meshlm.base"] = base_path;
      base = ckpt_model::open_lora_base(m, base_path, "ckpt export");
      tensors = out_tensors(ckpt_model::merged_tensors(file, m, adapters, *base), m.cfg);
    }
  }
  meta["meshlm.content"] = content;
  // The model's tensors under Hugging Face's names: a directory's, and a
  // Llama's in one file too (GPT-2's file keeps GPT2Model's names).
  if (content != "lora adapters" && (o.directory || m.cfg.arch != ModelArch::gpt2))
    for (OutTensor& t : tensors) t.name = load::hf::directory_name(t.name, m.cfg.arch);
  log::info("# ckpt export: {} (step {}, {}; {}) -> {} ({}{}, {} tensors)", in, m.step, content,
            model_str(m.cfg), out, o.directory ? "Hugging Face directory, " : "", dt->option,
            tensors.size());
  if (o.directory)
    write_hf_directory(out, tensors, *dt, meta, m.cfg, m.hf_config, o.shard_bytes,
                       {{"source", in}, {"step", std::to_string(m.step)}, {"content", content}},
                       "checkpoint '" + in + "'");
  else
    write_safetensors(out, tensors, *dt, meta, "checkpoint '" + in + "'");
  log::info("# ckpt export: wrote {} in {:.2f} s", out, now_seconds() - t0);
  return 0;
}

// ---------------------------------------------------------------------------
// import
// ---------------------------------------------------------------------------

namespace {

// The [model] keys of `cfg`, as a parameter file gives them.
std::string model_keys(const GPTConfig& c) {
  std::string s = fmt::format("arch = {}\nn_layer = {}\nn_head = {}\nn_embd = {}\nvocab_size = {}\n"
                              "max_seq_len = {}\n",
                              name_of(c.arch), c.n_layer, c.n_head, c.n_embd, c.vocab_size,
                              c.max_seq_len);
  if (c.arch == ModelArch::llama) {
    const ops::RopeScaling& r = c.rope_scaling;
    s += fmt::format("n_kv_head = {}\nintermediate_size = {}\nnorm_eps = {}\nrope_theta = {}\n"
                     "rope_factor = {}\nrope_low_freq_factor = {}\nrope_high_freq_factor = {}\n"
                     "rope_original_max_positions = {}\ntie_word_embeddings = {}\n",
                     c.kv_heads(), c.mlp_width(), c.norm_eps, c.rope_theta, r.factor,
                     r.low_freq_factor, r.high_freq_factor, r.original_max_positions,
                     c.tie_word_embeddings);
  }
  return s;
}

// Creates the float32 dataset /params/<name> and fills it a block of rows at
// a time from `src`; returns the XXH3-64 of its content.
uint64_t import_tensor(hid_t params, const ParamSpec& p, load::BaseSource& src,
                       std::vector<float>& buf) {
  std::vector<hsize_t> dims;
  for (int64_t d : dims_of(p.full_shape)) dims.push_back(static_cast<hsize_t>(d));
  h5::Dataset d = h5::create_dataset(params, p.name, H5T_IEEE_F32LE, dims);
  const int64_t R = p.full_shape[0], per = rows_per_block(p, kBlockFloats);
  const size_t rf = row_floats(p);
  buf.resize(static_cast<size_t>(std::min(per, R)) * rf);
  io::Xxh3_64 hash;
  for (int64_t r0 = 0; r0 < R; r0 += per) {
    const int64_t nr = std::min(per, R - r0);
    src.read_rows(p, r0, nr, buf.data());  // NaN and infinities refused here, naming the tensor
    h5::write_rows(d, static_cast<hsize_t>(r0), static_cast<hsize_t>(nr), H5T_NATIVE_FLOAT,
                   buf.data());
    const hsize_t n = static_cast<hsize_t>(nr) * rf;
    // The checksum is of the little-endian float32 values: the memory's
    // bytes on the little-endian hosts meshlm runs on.
    static_assert(std::endian::native == std::endian::little, "checksums hash little-endian floats");
    hash.update(buf.data(), static_cast<size_t>(n) * sizeof(float));
  }
  const uint64_t sum = hash.value();
  h5::write_scalar_attr<uint64_t>(d, ckpt::kChecksumAttr, sum);
  return sum;
}

}  // namespace

int ckpt_import(const std::vector<std::string>& args) {
  const std::vector<std::string> keys = {"n_layer", "n_head", "n_embd", "vocab_size", "max_seq_len"};
  std::set<std::string> with_value = {"output"};
  for (const std::string& k : keys) {
    with_value.insert(k);
    with_value.insert("model." + k);
  }
  const Args a = parse_args(args, "import", with_value, {});
  if (a.help) {
    std::fputs(kImportUsage, stdout);
    return 0;
  }
  auto bad = [](const std::string& what) {
    throw RankError(what + " (meshlm ckpt import --help)", MESHLM_HERE);
  };
  if (a.positional.size() != 1)
    bad(a.positional.empty() ? "no safetensors file named" : "one safetensors file at a time");
  const std::string in = a.positional[0];
  if (!a.values.count("output")) bad("no output file (-o OUT.h5)");
  const std::string out = a.values.at("output");
  // --KEY or --model.KEY, not both.
  std::map<std::string, int> given;
  for (const std::string& k : keys) {
    const bool plain = a.values.count(k) != 0, dotted = a.values.count("model." + k) != 0;
    if (plain && dotted) bad("--" + k + " and --model." + k + " both given");
    if (plain || dotted) given[k] = positive_int(k, a.values.at(plain ? k : "model." + k));
  }

  const double t0 = now_seconds();
  const std::string kind = load::is_directory(in) ? "" : non_regular_kind(in);
  if (!kind.empty()) throw RankError("safetensors file '" + in + "' is " + kind, MESHLM_HERE);
  if (same_file(in, out)) bad("the output '" + out + "' is the input itself");
  const std::string out_kind = non_regular_kind(out);
  if (!out_kind.empty())
    throw RankError("checkpoint '" + out + "': the path is " + out_kind, MESHLM_HERE);
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && !ckpt::is_checkpoint_file(out))
    throw RankError("checkpoint '" + out + "': a file that is not a meshlm checkpoint is already "
                        "there; meshlm replaces only its own checkpoints (remove it or name another)",
                    MESHLM_HERE);

  GPTConfig cfg;
  std::string heads_from = "--n_head", kept;
  if (load::is_directory(in)) {
    if (!given.empty())
      bad("--" + given.begin()->first + " with a Hugging Face directory: its config.json gives the "
          "model");
    const load::HfDirectory d = load::read_hf_directory(in);
    cfg = d.model;
    kept = d.kept;
    heads_from = "config.json";
  } else {
    const io::SafetensorsFile f(in);
    int heads = kDefaultHeads;
    if (given.count("n_head")) {
      heads = given.at("n_head");
    } else if (f.metadata().count("meshlm.n_head")) {
      heads = positive_int("n_head (the file's __metadata__ meshlm.n_head)",
                           f.metadata().at("meshlm.n_head"));
      heads_from = "the file's __metadata__";
    } else {
      heads_from = "GPT-2's default; --n_head sets it";
    }
    cfg = ckpt_model::infer_gpt2_model(f, heads);
    if (given.count("n_layer")) cfg.n_layer = given.at("n_layer");
    if (given.count("n_embd")) cfg.n_embd = given.at("n_embd");
    if (given.count("vocab_size")) cfg.vocab_size = given.at("vocab_size");
    if (given.count("max_seq_len")) cfg.max_seq_len = given.at("max_seq_len");
  }
  validate_model(cfg, "import of '" + in + "' (n_head " + std::to_string(cfg.n_head) + " from " +
                         heads_from + ")");
  // Every tensor's presence, shape and dtype checked here, before the
  // output is created.
  std::unique_ptr<load::BaseSource> src = load::open_base_source(in, cfg, 0);
  log::info("# ckpt import: {} -> {} ({}; n_head {} from {})", in, out, model_str(cfg), cfg.n_head,
            heads_from);

  const std::vector<ParamSpec> table = model_param_table(cfg);
  h5::AtomicWrite tmp(out);
  h5::File f = h5::create_file(tmp.tmp_path());
  std::vector<std::pair<std::string, uint64_t>> sums;
  {
    h5::Group params = h5::require_group(f, "params");
    std::vector<float> buf;
    ProgressBar bar("import", table.size());
    for (size_t i = 0; i < table.size(); ++i) {
      sums.emplace_back(ckpt::params_path(table[i].name), import_tensor(params, table[i], *src, buf));
      bar.update(i + 1, table[i].name);
    }
    bar.finish();
  }
  {
    ckpt::Meta meta;  // a full model at step 0, no training state
    load::set_model_meta(meta, cfg);
    meta.hf_config = kept;
    meta.created = utc_timestamp();
    meta.config = "# meshlm ckpt import of '" + in + "'\n[model]\n" + model_keys(cfg) +
                  "\n[finetune]\nmode = full\n";
    ckpt::write_meta(f, meta);
    h5::Group checks = h5::require_group(f, ckpt::kChecksumGroup);
    for (const auto& [path, sum] : sums) h5::write_scalar_attr<uint64_t>(checks, path, sum);
  }
  h5::close_file(f, tmp.tmp_path());
  tmp.commit();  // flushed to disk, then renamed
  log::info("# ckpt import: wrote {} ({} tensors) in {:.2f} s", out, table.size(), now_seconds() - t0);
  return 0;
}

}  // namespace meshlm
