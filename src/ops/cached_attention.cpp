// Attention against a key/value cache (ops/ops.h, meshlm generate).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/blas.h"
#include "ops/ops.h"

namespace meshlm::ops {

size_t cached_attention_scratch(int n, int keys, int threads) {
  const size_t rows = static_cast<size_t>(std::min(n, kCachedAttentionRows));
  return static_cast<size_t>(std::max(threads, 1)) * rows * static_cast<size_t>(keys);
}

void cached_attention_forward(float* out, float* kc, float* vc, const float* q, size_t ldq,
                              const float* k, const float* v, size_t ldkv, int n, int p0, int NH,
                              int NKV, int HS, float* scratch, size_t scratch_floats,
                              Precision p) {
  MESHLM_CHECK(n >= 1 && p0 >= 0 && NKV >= 1 && NH % NKV == 0 && HS >= 1,
               "cached_attention_forward: bad shape");
  const int Ckv = NKV * HS, C = NH * HS, keys_all = p0 + n;
  const size_t per_thread = cached_attention_scratch(n, keys_all, 1);
  MESHLM_CHECK(scratch_floats >= per_thread, "cached_attention_forward: scratch too small");
  for (int i = 0; i < n; ++i) {
    const size_t to = static_cast<size_t>(p0 + i) * Ckv;
    std::memcpy(kc + to, k + i * ldkv, Ckv * sizeof(float));
    std::memcpy(vc + to, v + i * ldkv, Ckv * sizeof(float));
  }
  const int group = NH / NKV, blocks = (n + kCachedAttentionRows - 1) / kCachedAttentionRows;
  const int threads = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(std::max(1, omp_get_max_threads())),
                       scratch_floats / per_thread));
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  // Products of one row as matrix-vector products (OpenBLAS's GEMM packs all
  // of K for a single row); below fp32 gemm() rounds their inputs.
  const bool gemv = p == Precision::fp32;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(threads)
  for (int h = 0; h < NH; ++h) {
    for (int b = 0; b < blocks; ++b) {
      float* s = scratch + static_cast<size_t>(omp_get_thread_num()) * per_thread;
      const int i0 = b * kCachedAttentionRows, rows = std::min(kCachedAttentionRows, n - i0);
      const int keys = p0 + i0 + rows;  // the block's last row sees them all
      const size_t kv = static_cast<size_t>(h / group) * HS;
      // S = scale Q_blk K^T over the keys the block's rows can see.
      const float* qh = q + i0 * ldq + static_cast<size_t>(h) * HS;
      if (rows == 1 && gemv)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, keys, HS, scale, kc + kv, Ckv, qh, 1, 0.0f, s, 1);
      else
        gemm(p, false, true, rows, keys, HS, scale, qh, static_cast<int>(ldq), kc + kv, Ckv, 0.0f,
             s, keys);
      for (int i = 0; i < rows; ++i) {
        float* row = s + static_cast<size_t>(i) * keys;
        const int last = p0 + i0 + i;  // this row's position: it sees keys [0, last]
        float mx = row[0];
        for (int j = 1; j <= last; ++j) mx = std::max(mx, row[j]);
        float sum = 0;
        for (int j = 0; j <= last; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j <= last; ++j) row[j] *= inv;
        for (int j = last + 1; j < keys; ++j) row[j] = 0;
      }
      float* y = out + static_cast<size_t>(i0) * C + static_cast<size_t>(h) * HS;
      if (rows == 1 && gemv)  // y = V^T p
        cblas_sgemv(CblasRowMajor, CblasTrans, keys, HS, 1.0f, vc + kv, Ckv, s, 1, 0.0f, y, 1);
      else
        gemm(p, false, false, rows, HS, keys, 1.0f, s, keys, vc + kv, Ckv, 0.0f, y, C);
    }
  }
}

}  // namespace meshlm::ops
