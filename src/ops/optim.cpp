// The optimizer's element-wise work on the CPU: AdamW over segments, the
// fixed-order sum of squares, scaling (ops/ops.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/ops.h"

namespace meshlm::ops {

void adamw_update(float* params, const float* grads, float* m, float* v,
                  std::span<const AdamWSegment> segments, const AdamWHyper& h) {
  for (const AdamWSegment& seg : segments) {
    const float decay = seg.decay ? 1.0f - h.lr * h.weight_decay : 1.0f;
    const float step_size = h.lr / h.bias_correction1;
    float* x = params + seg.begin;
    const float* g = grads + seg.begin;
    float* mt = m + seg.begin;
    float* vt = v + seg.begin;
    const long n = static_cast<long>(seg.count);
    const float b1 = h.beta1, b2 = h.beta2, eps = h.eps, bc2_sqrt = h.bias_correction2_sqrt;
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; ++i) {
      const float gi = g[i] * h.unscale * h.clip;
      float mi = b1 * mt[i] + (1.0f - b1) * gi;
      float vi = b2 * vt[i] + (1.0f - b2) * gi * gi;
      mt[i] = mi;
      vt[i] = vi;
      x[i] = x[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
  }
}

double sum_of_squares(const float* x, size_t n) {
  // Fixed blocks summed in a fixed order: the result does not depend on the
  // number of threads, so runs with different thread counts agree bit for bit.
  const size_t nblocks = (n + kSumOfSquaresBlock - 1) / kSumOfSquaresBlock;
  std::vector<double> partial(nblocks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < nblocks; ++b) {
    // Within a block a SIMD reduction, its order fixed by the build (the
    // CUDA backend's block sum is a tree of its own: the two agree within
    // rounding, not bit for bit).
    double s = 0.0;
    const size_t end = std::min(n, (b + 1) * kSumOfSquaresBlock);
#pragma omp simd reduction(+ : s)
    for (size_t i = b * kSumOfSquaresBlock; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[b] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

void mean(float* out, const float* x, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += x[i];
  out[0] = static_cast<float>(sum / static_cast<double>(n));
}

void scale(float* x, float factor, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] *= factor;
}

}  // namespace meshlm::ops
