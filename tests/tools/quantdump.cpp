// meshlm_quantdump: writes what meshlm's quantizer makes of a tensor, as raw
// bytes, so that tests/torch/check_nf4.py can compare it with an independent
// implementation of the formats.
//
//   meshlm_quantdump levels OUT
//       the 16 NF4 levels of quant/formats.h, float32 (64 bytes).
//   meshlm_quantdump quantize TYPE IN OUTDIR
//       IN: raw float32, n = size / 4 elements. TYPE: f32, int8 or nf4.
//       Writes OUTDIR/<array>.bin for every array of the type's QLayout
//       (data, absmax, absmax2, offset: raw little-endian, exactly count *
//       element size bytes) and OUTDIR/dequant.f32 (the n values back).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <optional>
#include <vector>

#include "quant/quantize.h"

using namespace meshlm::quant;

namespace {

void write_file(const std::string& path, const void* p, size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(p), static_cast<std::streamsize>(bytes));
  if (!f) throw std::runtime_error("cannot write " + path);
}

int dump_quantize(const std::string& type_name, const std::string& in, const std::string& dir) {
  std::ifstream f(in, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + in);
  const std::vector<char> raw((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
  if (raw.empty() || raw.size() % sizeof(float) != 0)
    throw std::runtime_error(in + ": not a non-empty array of float32");
  std::vector<float> x(raw.size() / sizeof(float));
  std::copy(raw.begin(), raw.end(), reinterpret_cast<char*>(x.data()));

  const std::optional<QuantType> type = meshlm::enum_from_name<QuantType>(type_name);
  if (!type) throw std::runtime_error("unknown format '" + std::string(type_name) + "'");
  const QLayout layout = qlayout(*type, x.size());
  std::vector<uint8_t> mem(layout.total_bytes, 0);
  const QTensor t = qtensor_at(layout, mem.data());
  quantize_ref(x.data(), t);
  for (int k = 0; k < layout.narrays; ++k) {
    const QArray& a = layout.arrays[k];
    write_file(dir + "/" + a.name + ".bin", mem.data() + a.offset, a.bytes());
  }
  std::vector<float> y(x.size());
  dequantize_ref(t, 0, y.size(), y.data());
  write_file(dir + "/dequant.f32", y.data(), y.size() * sizeof(float));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rc = 2;
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "levels" && argc == 3) {
      write_file(argv[2], kNF4Levels, sizeof(kNF4Levels));
      rc = 0;
    } else if (cmd == "quantize" && argc == 5) {
      rc = dump_quantize(argv[2], argv[3], argv[4]);
    } else {
      std::fprintf(stderr,
                   "usage: meshlm_quantdump levels OUT\n"
                   "       meshlm_quantdump quantize f32|int8|nf4 IN.f32 OUTDIR\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshlm_quantdump: %s\n", e.what());
    rc = 1;
  }
  return rc;
}
