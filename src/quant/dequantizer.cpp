#include "quant/dequantizer.h"

#include <algorithm>

namespace meshlm::quant {

namespace {

class CpuDequantizer final : public Dequantizer {
public:
  Device device() const override { return Device::cpu; }
  void rows(const QSlice& w, int64_t i0, int64_t n, float* out) const override {
    dequantize_rows(w, i0, n, out);
  }
  void lookup(float* out, const int32_t* ids, int N, const QSlice& w,
              int64_t first) const override {
    const int64_t Kl = w.local_cols(), R = w.local_rows();
    for (int r = 0; r < N; ++r) {
      float* o = out + static_cast<size_t>(r) * Kl;
      const int64_t i = ids[r] - first;
      if (i >= 0 && i < R)
        dequantize_rows(w, i, 1, o);
      else
        std::fill(o, o + Kl, 0.0f);
    }
  }
};

}  // namespace

const Dequantizer& Dequantizer::cpu() {
  static const CpuDequantizer d;
  return d;
}

}  // namespace meshlm::quant
