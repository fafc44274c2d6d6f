// Softmax + cross-entropy over a vocabulary padded from V to Vp columns. The
// padded columns exist so that the lm_head GEMM has friendly sizes; they are
// excluded from the softmax (probability 0, never the argmax) and get exactly
// zero gradient, so the padded rows of wte never move.
#include <cmath>

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
