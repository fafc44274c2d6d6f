// Softmax + cross-entropy over a vocabulary padded from V to Vp columns and
// split by columns over the tensor-parallel group (Megatron): each rank holds
// logits for columns [v0, v0 + Vl), and the softmax is assembled from a MAX and
// a SUM reduction of per-row pieces (see ops.h). The padded columns exist so
// that the lm_head GEMM has friendly sizes; they are excluded from the softmax
// (probability 0, never the max) and get exactly zero gradient, so the padded
// rows of wte never move. A rank may hold only padding columns: it contributes
// -inf to the max and 0 to the sums.
#include <cmath>
#include <limits>

#include "ops/ops.h"

namespace meshlm::ops {

// Real (unpadded) columns of this rank's part: [0, nreal).
static inline int real_columns(int Vl, int v0, int V) {
  const int n = V - v0;
  return n < 0 ? 0 : (n > Vl ? Vl : n);
}

template <typename T>
void xent_local_max(T* rowmax, const T* logits, int N, int Vl, int v0, int V) {
  const int nreal = real_columns(Vl, v0, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = logits + static_cast<size_t>(n) * Vl;
    T mx = -std::numeric_limits<T>::infinity();  // -inf when this part is all padding
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < nreal; ++v) mx = row[v] > mx ? row[v] : mx;
    rowmax[n] = mx;
  }
}

template <typename T>
void xent_local_sums(T* sums, const T* logits, const T* rowmax, const int32_t* targets, int N,
                     int Vl, int v0, int V) {
  const int nreal = real_columns(Vl, v0, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = logits + static_cast<size_t>(n) * Vl;
    const T mx = rowmax[n];
    // SIMD reduction: its summation order is fixed by the build, so results
    // stay reproducible run to run.
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < nreal; ++v) sum += std::exp(row[v] - mx);
    const int t = targets[n] - v0;
    sums[2 * n] = sum;
    sums[2 * n + 1] = (t >= 0 && t < nreal) ? row[t] : T(0);
  }
}

template <typename T>
void xent_losses(T* losses, const T* rowmax, const T* sums, int N) {
  // -log p[target] from the log-sum-exp, finite even where p underflows.
  for (int n = 0; n < N; ++n) losses[n] = std::log(sums[2 * n]) + rowmax[n] - sums[2 * n + 1];
}

template <typename T>
void xent_local_backward(T* logits_dlogits, const T* rowmax, const T* sums, const T* dlosses,
                         const int32_t* targets, int N, int Vl, int v0, int V) {
  const int nreal = real_columns(Vl, v0, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* row = logits_dlogits + static_cast<size_t>(n) * Vl;
    const T mx = rowmax[n], inv = T(1) / sums[2 * n], d = dlosses[n];
#pragma omp simd
    for (int v = 0; v < nreal; ++v) row[v] = std::exp(row[v] - mx) * inv * d;
    for (int v = nreal; v < Vl; ++v) row[v] = 0;
    const int t = targets[n] - v0;
    if (t >= 0 && t < nreal) row[t] -= d;
  }
}

#define MESHLM_XENT(T)                                                                         \
  template void xent_local_max<T>(T*, const T*, int, int, int, int);                           \
  template void xent_local_sums<T>(T*, const T*, const T*, const int32_t*, int, int, int, int); \
  template void xent_losses<T>(T*, const T*, const T*, int);                                   \
  template void xent_local_backward<T>(T*, const T*, const T*, const T*, const int32_t*, int,  \
                                       int, int, int);
MESHLM_XENT(float)
MESHLM_XENT(double)
#undef MESHLM_XENT

}  // namespace meshlm::ops
