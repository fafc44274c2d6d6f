// Fuzz target: the safetensors reader (io/safetensors.h). The input is the
// whole file: the 8-byte header length, the JSON header and the data block.
// SafetensorsFile opens and checks it; then every float tensor that the
// header accepted is read (whole when small, else its first and last
// elements), so that an accepted header must also be a safe one to read.
//
// A RankError is the expected answer to a bad file; any other exception, a
// crash or a sanitizer report is a finding.
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "fuzz_targets.h"
#include "io/safetensors.h"

namespace meshlm::fuzz {

void fuzz_safetensors(const uint8_t* data, size_t size) {
  const std::string path = write_scratch_file("model.safetensors", data, size);
  try {
    io::SafetensorsFile f(path);
    // What the header promised: every range inside the data block, sorted.
    uint64_t prev_begin = 0;
    for (const io::SafetensorsTensor& t : f.tensors()) {
      if (t.end > f.file_size() - f.data_start() || t.begin > t.end || t.begin < prev_begin) {
        std::fprintf(stderr, "tensor '%s' [%llu, %llu) breaks the header's promises\n",
                     t.name.c_str(), static_cast<unsigned long long>(t.begin),
                     static_cast<unsigned long long>(t.end));
        std::abort();
      }
      prev_begin = t.begin;
      (void)f.info(t.name);
    }
    std::vector<float> out;
    for (const io::SafetensorsTensor& t : f.tensors()) {
      if (!io::safetensors_dtype_is_float(t.dtype)) continue;
      const uint64_t n = t.numel();
      if (n <= (1u << 16)) {
        out.resize(n);
        f.read_f32(t.name, out.data());
      } else {
        out.resize(2);
        f.read_f32(t.name, out.data(), 0, 1);
        f.read_f32(t.name, out.data() + 1, n - 1, 1);
      }
    }
    report("accepted");
  } catch (const meshlm::Error& e) {
    report(e.what());
  }
}

}  // namespace meshlm::fuzz

MESHLM_FUZZ_ENTRY(meshlm::fuzz::fuzz_safetensors)
