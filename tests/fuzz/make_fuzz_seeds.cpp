// Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/)
// with meshlm's own writers, so that the seeds are the files meshlm makes:
//
//   make_fuzz_seeds OUT_DIR INPUTS_DIR
//
// parameter_file: the parameter files of INPUTS_DIR (inputs/), two of them
//   with command-line overrides and a rank count appended, and structured
//   inputs (fuzz_parameter_file.cpp).
// safetensors: small valid files (every float dtype, an integer tensor, a
//   scalar, an empty tensor, metadata), written as the format says.
// tokens: raw files of 2 and 4 bytes per token (io::write_tokens_raw), HDF5
//   files of uint16 and uint32 ids (io::write_tokens_h5), and an input
//   of zeros (the structured target's plain file).
// quant_cache: caches of fuzz_quant_cache's model written by
//   io::write_quant_cache (one with the target's key, one with another),
//   and an input of zeros (the structured target's plain cache).
//
// The committed corpus was made by this program; run it again (in a build
// with MESHLM_FUZZ=ON) after a change of a format, then commit the files.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "fuzz_targets.h"
#include "io/quant_cache.h"
#include "io/tokens.h"

namespace fs = std::filesystem;
using namespace meshlm;

namespace {

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A safetensors file: tensors (name, dtype, shape, element size) with
// deterministic bytes, in the given order, plus metadata.
struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  size_t esize;
};
std::string safetensors(const std::vector<Tensor>& tensors, bool metadata, uint32_t seed) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  std::mt19937 rng(seed);
  for (const Tensor& t : tensors) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    const size_t begin = data.size();
    for (size_t i = 0; i < n * t.esize; ++i) data += static_cast<char>(rng());
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  if (metadata) header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';  // the format pads the header with spaces
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t(h.size()) >> (8 * i));
  return out + h + data;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR INPUTS_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1], inputs = argv[2];
  for (const char* t : {"parameter_file", "safetensors", "tokens", "quant_cache"})
    fs::create_directories(out / t);

  // parameter_file
  std::vector<fs::path> cfgs;
  for (const auto& e : fs::directory_iterator(inputs))
    if (e.path().extension() == ".cfg") cfgs.push_back(e.path());
  std::sort(cfgs.begin(), cfgs.end());
  for (const fs::path& p : cfgs) fs::copy_file(p, out / "parameter_file" / p.filename(),
                                               fs::copy_options::overwrite_existing);
  const fs::path pf = out / "parameter_file";
  if (fs::exists(inputs / "tiny.cfg"))
    write_bytes(pf / "tiny-overrides", read_bytes(inputs / "tiny.cfg") + '\0' +
                    "--parallel.dp=0\n--parallel.pp=2\n--train.micro_batch_size=1\n"
                    "--parallel.schedule=1f1b\n--parallel.stage_layers=1,1" + '\0' + "8");
  if (fs::exists(inputs / "qlora-tiny.cfg"))
    write_bytes(pf / "qlora-tiny-overrides", read_bytes(inputs / "qlora-tiny.cfg") + '\0' +
                    "--quant.type=int8\n--finetune.lora_targets=qkv\n--parallel.zero_stage=2\n"
                    "--parallel.activation_checkpointing=full" + '\0' + "8");

  // Structured inputs (0x01, then decisions): zeros, and a few at random.
  write_bytes(pf / "structured-plain", std::string(1, '\x01') + std::string(32, '\0'));
  std::mt19937 pf_rng(5);
  for (int i = 0; i < 3; ++i) {
    std::string bytes(1, '\x01');
    for (int j = 0; j < 48; ++j) bytes += static_cast<char>(pf_rng());
    write_bytes(pf / ("structured-" + std::to_string(i)), bytes);
  }

  // safetensors
  const fs::path st = out / "safetensors";
  write_bytes(st / "every-dtype.safetensors",
              safetensors({{"wte", "F32", {4, 3}, 4}, {"wpe", "F16", {2, 2}, 2},
                           {"ln_f.weight", "BF16", {3}, 2}, {"ln_f.bias", "F64", {2}, 8},
                           {"ids", "I64", {2}, 8}, {"scale", "F32", {}, 4},
                           {"empty", "F32", {0, 4}, 4}},
                          true, 1));
  write_bytes(st / "gpt2-block.safetensors",
              safetensors({{"h.0.attn.c_attn.weight", "F32", {2, 6}, 4},
                           {"h.0.attn.c_attn.bias", "F32", {6}, 4},
                           {"h.0.mlp.c_fc.weight", "F16", {2, 8}, 2}},
                          false, 2));
  write_bytes(st / "one.safetensors", safetensors({{"x", "F32", {2}, 4}}, false, 3));

  // tokens
  const fs::path tk = out / "tokens";
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 24; ++i) ids.push_back((i * 37 + 5) % 256);
  io::write_tokens_raw((tk / "raw16.bin").string(), ids, 2);
  io::write_tokens_raw((tk / "raw32.bin").string(), ids, 4);
  io::write_tokens_h5((tk / "u16.h5").string(), ids, 256);
  ids.back() = 69999;
  io::write_tokens_h5((tk / "u32.h5").string(), ids, 70000);
  write_bytes(tk / "structured-plain", std::string(64, '\0'));  // zeros: the plain file

  // quant_cache
  const fs::path qc = out / "quant_cache";
  const std::vector<io::CacheTensor> layout = fuzz::quant_cache_layout();
  std::vector<uint8_t> store(fuzz::kQuantCacheStoreBytes);
  std::mt19937 rng(4);
  for (uint8_t& b : store) b = static_cast<uint8_t>(rng());
  io::write_quant_cache((qc / "hit.h5").string(), fuzz::quant_cache_key(), layout, store.data(),
                        store.size());
  io::CacheKey other = fuzz::quant_cache_key();
  other.settings[1].second = "32";
  io::write_quant_cache((qc / "other-key.h5").string(), other, layout, store.data(), store.size());
  write_bytes(qc / "structured-plain", std::string(64, '\0'));  // zeros: the plain cache
  return 0;
}
