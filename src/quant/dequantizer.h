// Dequantization of a frozen base's rows on one backend: the CPU reference
// (quant::dequantize_rows) on host memory, or the CUDA kernels of
// cuda/ops_cuda.h on device memory (cuda/kernels_cuda.h). The quantized
// layers (quant/qlinear.h) and the quantized embedding lookup of the model
// take one beside the ops::Kernels of the same backend; the QSlice's arrays
// and every other pointer are in that backend's memory. Both give the same
// bits (cuda/quant.cu says why).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"
#include "quant/qlinear.h"

namespace meshlm::quant {

class Dequantizer {
public:
  virtual ~Dequantizer() = default;
  // The CPU reference (OpenMP over rows).
  static const Dequantizer& cpu();
  // Where the pointers given to this dequantizer live.
  virtual Device device() const = 0;

  // out(n, local_cols) = local rows [i0, i0 + n) of w, row-major
  // (quant::dequantize_rows).
  virtual void rows(const QSlice& w, int64_t i0, int64_t n, float* out) const = 0;
  // A lookup in a quantized table: row r of out(N, local_cols) is local row
  // ids[r] - first of w when that lies in [0, local_rows), else zeros (the
  // vocabulary-parallel embedding: each rank gives the rows it holds).
  virtual void lookup(float* out, const int32_t* ids, int N, const QSlice& w,
                      int64_t first) const = 0;
};

}  // namespace meshlm::quant
