// Causal self-attention that keeps only each row's log-sum-exp (ops.h,
// flash_attention_*), on the CPU: the reference of the GPU's fused kernel
// (cuda/flash_attention.cu) and the same memory saving for CPU runs.
//
// Per (batch, head) the query rows go kFlashRows at a time: their scores
// against every key up to the block's last row are one GEMM into per-thread
// scratch (kFlashRows x T), softmaxed row by row, and multiplied by V.
// The backward recomputes the probabilities of the block from the
// log-sum-exp, so nothing of size T x T outlives a block.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/blas.h"
#include "ops/ops.h"
#include "ops/vec_math.h"

namespace meshlm::ops {

namespace {

constexpr int kFlashRows = 64;

// The strided (T, HS) views of one (b, h) pair.
struct HeadViews {
  size_t qoff;  // q of (b, h) in qkv; k at + C, v at + 2C
  size_t yoff;  // (b, h) in out / dout
  size_t soff;  // (b, h) in lse / delta
};

HeadViews head_views(int b, int h, int Tn, int C, int NH) {
  const int HS = C / NH;
  return {static_cast<size_t>(b) * Tn * 3 * C + static_cast<size_t>(h) * HS,
          static_cast<size_t>(b) * Tn * C + static_cast<size_t>(h) * HS,
          (static_cast<size_t>(b) * NH + h) * Tn};
}

}  // namespace

template <typename T>
void flash_attention_forward(T* out, T* lse, const T* qkv, int B, int Tn, int C, int NH,
                             Precision pr) {
  const int HS = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
#pragma omp parallel
  {
    std::vector<T> s(static_cast<size_t>(kFlashRows) * Tn);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const HeadViews v = head_views(b, h, Tn, C, NH);
        const T* q = qkv + v.qoff;
        const T* k = q + C;
        const T* val = q + 2 * C;
        for (int t0 = 0; t0 < Tn; t0 += kFlashRows) {
          const int rows = std::min(kFlashRows, Tn - t0), keys = t0 + rows;
          // S = scale Q_blk K^T over the keys the block's rows can see.
          gemm(pr, false, true, rows, keys, HS, scale, q + static_cast<size_t>(t0) * C3, C3, k, C3,
               T(0), s.data(), keys);
          for (int i = 0; i < rows; ++i) {
            const int t = t0 + i;
            T* row = s.data() + static_cast<size_t>(i) * keys;
            T mx = row[0];
            for (int j = 1; j <= t; ++j) mx = row[j] > mx ? row[j] : mx;
            T sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j <= t; ++j) {
              row[j] = exp_of(row[j] - mx);
              sum += row[j];
            }
            lse[v.soff + t] = mx + std::log(sum);
            const T inv = T(1) / sum;
            for (int j = 0; j <= t; ++j) row[j] *= inv;
            for (int j = t + 1; j < keys; ++j) row[j] = 0;
          }
          gemm(pr, false, false, rows, HS, keys, T(1), s.data(), keys, val, C3, T(0),
               out + v.yoff + static_cast<size_t>(t0) * C, C);
        }
      }
    }
  }
}

template <typename T>
void flash_attention_backward(T* dqkv, T* delta, const T* dout, const T* out, const T* qkv,
                              const T* lse, int B, int Tn, int C, int NH, Precision pr) {
  const int HS = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
#pragma omp parallel
  {
    std::vector<T> p(static_cast<size_t>(kFlashRows) * Tn), dp(p.size());
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const HeadViews v = head_views(b, h, Tn, C, NH);
        const T* q = qkv + v.qoff;
        const T* k = q + C;
        const T* val = q + 2 * C;
        T* dq = dqkv + v.qoff;
        T* dk = dq + C;
        T* dv = dq + 2 * C;
        for (T* d : {dq, dk, dv}) zero_rows(d, Tn, HS, C3);  // overwritten, not accumulated
        const T* dy = dout + v.yoff;
        const T* y = out + v.yoff;
        T* D = delta + v.soff;
        // D_t = sum_s P_ts dP_ts = dY_t . Y_t
        for (int t = 0; t < Tn; ++t) {
          T acc = 0;
          for (int d = 0; d < HS; ++d)
            acc += dy[static_cast<size_t>(t) * C + d] * y[static_cast<size_t>(t) * C + d];
          D[t] = acc;
        }
        for (int t0 = 0; t0 < Tn; t0 += kFlashRows) {
          const int rows = std::min(kFlashRows, Tn - t0), keys = t0 + rows;
          const T* qb = q + static_cast<size_t>(t0) * C3;
          const T* dyb = dy + static_cast<size_t>(t0) * C;
          // P = exp(scale Q K^T - lse), 0 above the diagonal.
          gemm(pr, false, true, rows, keys, HS, scale, qb, C3, k, C3, T(0), p.data(), keys);
          for (int i = 0; i < rows; ++i) {
            const int t = t0 + i;
            T* row = p.data() + static_cast<size_t>(i) * keys;
            const T l = lse[v.soff + t];
#pragma omp simd
            for (int j = 0; j <= t; ++j) row[j] = exp_of(row[j] - l);
            for (int j = t + 1; j < keys; ++j) row[j] = 0;
          }
          // dP = dY V^T ; dV += P^T dY
          gemm(pr, false, true, rows, keys, HS, T(1), dyb, C, val, C3, T(0), dp.data(), keys);
          gemm(pr, true, false, keys, HS, rows, T(1), p.data(), keys, dyb, C, T(1), dv, C3);
          // dS = P (dP - D) scale, 0 above the diagonal (P is 0 there).
          for (int i = 0; i < rows; ++i) {
            const T* prow = p.data() + static_cast<size_t>(i) * keys;
            T* drow = dp.data() + static_cast<size_t>(i) * keys;
            for (int j = 0; j < keys; ++j) drow[j] = prow[j] * (drow[j] - D[t0 + i]) * scale;
          }
          // dQ += dS K ; dK += dS^T Q
          gemm(pr, false, false, rows, HS, keys, T(1), dp.data(), keys, k, C3, T(1),
               dq + static_cast<size_t>(t0) * C3, C3);
          gemm(pr, true, false, keys, HS, rows, T(1), dp.data(), keys, qb, C3, T(1), dk, C3);
        }
      }
    }
  }
}

template void flash_attention_forward<float>(float*, float*, const float*, int, int, int, int, Precision);
template void flash_attention_forward<double>(double*, double*, const double*, int, int, int, int, Precision);
template void flash_attention_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int, int, int, int, Precision);
template void flash_attention_backward<double>(double*, double*, const double*, const double*, const double*, const double*, int, int, int, int, Precision);

}  // namespace meshlm::ops
