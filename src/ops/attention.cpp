// Causal multi-head self-attention on the CPU. Per (batch, head) it is three
// GEMMs on strided views of qkv(B,T,3C) plus a masked softmax:
//   S = Q K^T / sqrt(HS);  P = softmax_causal(S);  Y = P V
// The (b, h) pairs are spread over OpenMP threads; the GEMM inside runs on the
// calling thread only (OpenBLAS does not nest inside a parallel region).
#include <cmath>

#include "ops/blas.h"
#include "ops/ops.h"
#include "ops/vec_math.h"

namespace meshlm::ops {

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int B, int Tn, int C, int NH, Precision pr) {
  const int HS = C / NH;
  const int C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const T* q = qkv + static_cast<size_t>(b) * Tn * C3 + h * HS;  // (T,HS), row stride 3C
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* p = att + (static_cast<size_t>(b) * NH + h) * Tn * Tn;  // (T,T)
      T* y = out + static_cast<size_t>(b) * Tn * C + h * HS;      // (T,HS), row stride C
      gemm(pr, false, true, Tn, Tn, HS, scale, q, C3, k, C3, T(0), p, Tn);
      for (int t = 0; t < Tn; ++t) {
        T* row = p + static_cast<size_t>(t) * Tn;
        T mx = row[0];
        for (int s = 1; s <= t; ++s) mx = row[s] > mx ? row[s] : mx;
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int s = 0; s <= t; ++s) {
          row[s] = exp_of(row[s] - mx);
          sum += row[s];
        }
        T inv = T(1) / sum;
        for (int s = 0; s <= t; ++s) row[s] *= inv;
        for (int s = t + 1; s < Tn; ++s) row[s] = 0;  // the future is masked
      }
      gemm(pr, false, false, Tn, HS, Tn, T(1), p, Tn, v, C3, T(0), y, C);
    }
  }
}

template <typename T>
void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att, int B, int Tn,
                        int C, int NH, Precision pr) {
  const int HS = C / NH;
  const int C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(HS));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const size_t qoff = static_cast<size_t>(b) * Tn * C3 + h * HS;
      const T* q = qkv + qoff;
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* dq = dqkv + qoff;
      T* dk = dq + C;
      T* dv = dq + 2 * C;
      for (T* d : {dq, dk, dv}) zero_rows(d, Tn, HS, C3);  // overwritten, not accumulated
      const T* p = att + (static_cast<size_t>(b) * NH + h) * Tn * Tn;
      T* dp = datt + (static_cast<size_t>(b) * NH + h) * Tn * Tn;
      const T* dy = dout + static_cast<size_t>(b) * Tn * C + h * HS;
      // dP = dY V^T ; dV += P^T dY
      gemm(pr, false, true, Tn, Tn, HS, T(1), dy, C, v, C3, T(0), dp, Tn);
      gemm(pr, true, false, Tn, HS, Tn, T(1), p, Tn, dy, C, T(1), dv, C3);
      // Softmax backward, row by row: dS = P * (dP - sum_s P dP); masked = 0.
      for (int t = 0; t < Tn; ++t) {
        const T* prow = p + static_cast<size_t>(t) * Tn;
        T* drow = dp + static_cast<size_t>(t) * Tn;
        T dot = 0;
        for (int s = 0; s <= t; ++s) dot += prow[s] * drow[s];
        for (int s = 0; s <= t; ++s) drow[s] = prow[s] * (drow[s] - dot) * scale;
        for (int s = t + 1; s < Tn; ++s) drow[s] = 0;
      }
      // S = scale Q K^T (scale folded into dS above): dQ += dS K ; dK += dS^T Q
      gemm(pr, false, false, Tn, HS, Tn, T(1), dp, Tn, k, C3, T(1), dq, C3);
      gemm(pr, true, false, Tn, HS, Tn, T(1), dp, Tn, q, C3, T(1), dk, C3);
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int, Precision);
template void attention_forward<double>(double*, double*, const double*, int, int, int, int, Precision);
template void attention_backward<float>(float*, float*, const float*, const float*, const float*, int, int, int, int, Precision);
template void attention_backward<double>(double*, double*, const double*, const double*, const double*, int, int, int, int, Precision);

}  // namespace meshlm::ops
