// Softmax + cross-entropy over a vocabulary padded from V to Vp columns and
// split by columns over the tensor-parallel group (Megatron): each rank holds
// logits for columns [v0, v0 + Vl), and the softmax is assembled from a MAX and
// a SUM reduction of per-row pieces (see ops.h). The padded columns exist so
// that the lm_head GEMM has friendly sizes; they are excluded from the softmax
// (probability 0, never the max) and get exactly zero gradient, so the padded
// rows of wte never move. A rank may hold only padding columns: it contributes
// -inf to the max and 0 to the sums.
//
// Each op is a loop over rows of one per-row function; xent_rows runs the
// three per-row functions on one row after the other, while the row (200 KiB
// for GPT-2's vocabulary) is still in the core's L2 cache, so the logits
// come from memory once instead of three times, with the same bits. e^x is
// ops/vec_math.h's (vectorised) in float, the library's in double.
#include <cmath>
#include <limits>

#include "ops/ops.h"
#include "ops/vec_math.h"

namespace meshlm::ops {

namespace {

// Real (unpadded) columns of this rank's part: [0, nreal).
inline int real_columns(int Vl, int v0, int V) {
  const int n = V - v0;
  return n < 0 ? 0 : (n > Vl ? Vl : n);
}

template <typename T>
T row_max(const T* row, int nreal) {
  T mx = -std::numeric_limits<T>::infinity();  // -inf when this part is all padding
#pragma omp simd reduction(max : mx)
  for (int v = 0; v < nreal; ++v) mx = row[v] > mx ? row[v] : mx;
  return mx;
}

// sums[0] = sum exp(row - mx) over the real columns, sums[1] = the target's
// logit where this part holds it, else 0.
template <typename T>
void row_sums(T* sums, const T* row, T mx, int target, int nreal) {
  // SIMD reduction: its summation order is fixed by the build, so results
  // stay reproducible run to run.
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int v = 0; v < nreal; ++v) sum += exp_of(row[v] - mx);
  sums[0] = sum;
  sums[1] = (target >= 0 && target < nreal) ? row[target] : T(0);
}

template <typename T>
void row_backward(T* row, T mx, T sum, T d, int target, int nreal, int Vl) {
  const T inv = T(1) / sum;
#pragma omp simd
  for (int v = 0; v < nreal; ++v) row[v] = exp_of(row[v] - mx) * inv * d;
  for (int v = nreal; v < Vl; ++v) row[v] = 0;
  if (target >= 0 && target < nreal) row[target] -= d;
}

}  // namespace

template <typename T>
void xent_local_max(T* rowmax, const T* logits, int N, int Vl, int v0, int V) {
  const int nreal = real_columns(Vl, v0, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) rowmax[n] = row_max(logits + static_cast<size_t>(n) * Vl, nreal);
}

template <typename T>
void xent_local_sums(T* sums, const T* logits, const T* rowmax, const int32_t* targets, int N,
                     int Vl, int v0, int V) {
  const int nreal = real_columns(Vl, v0, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n)
    row_sums(sums + 2 * static_cast<size_t>(n), logits + static_cast<size_t>(n) * Vl, rowmax[n],
             targets[n] - v0, nreal);
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
  for (int n = 0; n < N; ++n)
    row_backward(logits_dlogits + static_cast<size_t>(n) * Vl, rowmax[n], sums[2 * n], dlosses[n],
                 targets[n] - v0, nreal, Vl);
}

template <typename T>
void xent_rows(T* logits_dlogits, T* rowmax, T* sums, const T* dlosses, const int32_t* targets,
               int N, int Vl, int V) {
  const int nreal = real_columns(Vl, 0, V);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* row = logits_dlogits + static_cast<size_t>(n) * Vl;
    rowmax[n] = row_max(row, nreal);
    row_sums(sums + 2 * static_cast<size_t>(n), row, rowmax[n], targets[n], nreal);
    if (dlosses != nullptr)
      row_backward(row, rowmax[n], sums[2 * n], dlosses[n], targets[n], nreal, Vl);
  }
}

#define MESHLM_XENT(T)                                                                         \
  template void xent_local_max<T>(T*, const T*, int, int, int, int);                           \
  template void xent_local_sums<T>(T*, const T*, const T*, const int32_t*, int, int, int, int); \
  template void xent_losses<T>(T*, const T*, const T*, int);                                   \
  template void xent_local_backward<T>(T*, const T*, const T*, const T*, const int32_t*, int,  \
                                       int, int, int);                                         \
  template void xent_rows<T>(T*, T*, T*, const T*, const int32_t*, int, int, int);
MESHLM_XENT(float)
MESHLM_XENT(double)
#undef MESHLM_XENT

}  // namespace meshlm::ops
