// Softmax + cross-entropy over a vocabulary padded from V to Vp columns. The
// padded columns exist so that the lm_head GEMM has friendly sizes; they are
// excluded from the softmax (probability 0, never the argmax) and get exactly
// zero gradient, so the padded rows of wte never move.
#include <cmath>
#include <limits>

#include "ops/ops.h"

namespace meshlm::ops {

template <typename T>
void softmax_crossentropy_forward(T* losses, T* logits_probs, const int32_t* targets, int N, int V,
                                  int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* row = logits_probs + static_cast<size_t>(n) * Vp;
    const T target_logit = row[targets[n]];
    // SIMD reductions: their summation order is fixed by the build, so
    // results stay reproducible run to run.
    T mx = row[0];
#pragma omp simd reduction(max : mx)
    for (int v = 1; v < V; ++v) mx = row[v] > mx ? row[v] : mx;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; ++v) {
      row[v] = std::exp(row[v] - mx);
      sum += row[v];
    }
    const T inv = T(1) / sum;
#pragma omp simd
    for (int v = 0; v < V; ++v) row[v] *= inv;
    for (int v = V; v < Vp; ++v) row[v] = 0;
    // -log p[target] from the log-sum-exp, finite even where p underflows.
    losses[n] = std::log(sum) + mx - target_logit;
  }
}

template <typename T>
void softmax_crossentropy_backward(T* probs_dlogits, const T* dlosses, const int32_t* targets,
                                   int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* row = probs_dlogits + static_cast<size_t>(n) * Vp;
    T d = dlosses[n];
    for (int v = 0; v < V; ++v) row[v] *= d;
    row[targets[n]] -= d;
    for (int v = V; v < Vp; ++v) row[v] = 0;
  }
}

template void softmax_crossentropy_forward<float>(float*, float*, const int32_t*, int, int, int);
template void softmax_crossentropy_forward<double>(double*, double*, const int32_t*, int, int, int);
template void softmax_crossentropy_backward<float>(float*, const float*, const int32_t*, int, int, int);
template void softmax_crossentropy_backward<double>(double*, const double*, const int32_t*, int, int, int);

}  // namespace meshlm::ops

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
    T mx = -std::numeric_limits<T>::infinity();
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
