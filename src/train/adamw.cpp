#include "train/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

#include "ops/parallel.h"

namespace meshlm {

void AdamWConfig::validate() const {
  auto fail = [](const char* msg) { throw CollectiveError(msg, MESHLM_HERE); };
  // Written so that NaN fails every test.
  if (!(weight_decay >= 0 && std::isfinite(weight_decay))) fail("train.weight_decay must be finite and >= 0");
  if (!(beta1 >= 0 && beta1 < 1)) fail("train.beta1 must lie in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) fail("train.beta2 must lie in [0, 1)");
  if (!(eps > 0 && std::isfinite(eps))) fail("train.eps must be finite and > 0");
}

AdamW::AdamW(const std::vector<ParamSpec>& table, const AdamWConfig& cfg, size_t begin,
             size_t end)
    : table_(table), cfg_(cfg), begin_(begin), end_(end == SIZE_MAX ? table_numel(table) : end) {
  MESHLM_CHECK(begin_ <= end_, "AdamW range is reversed");
  // A ZeRO shard may reach into the padding past the table: its moments are
  // still end - begin long, so every DP rank holds the same bytes.
  const size_t n = end_ - begin_;
  m_ = Buffer(n * sizeof(float), MemCategory::optimizer, "adamw.m");
  v_ = Buffer(n * sizeof(float), MemCategory::optimizer, "adamw.v");
}

void AdamW::step(float* params, const float* grads, float lr) {
  ++t_;
  // The update runs in float: the hyperparameters are rounded to float once.
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float eps = static_cast<float>(cfg_.eps), wd = static_cast<float>(cfg_.weight_decay);
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b1), t_));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(b2), t_)));
  const float step_size = lr / bc1;
  for (const ParamSpec& p : table_) {
    // The part of this tensor inside [begin, end).
    const size_t lo = std::max(p.offset, begin_), hi = std::min(p.offset + p.numel(), end_);
    if (lo >= hi) continue;
    const float decay = p.decay() ? 1.0f - lr * wd : 1.0f;
    float* x = params + lo;
    const float* g = grads + (lo - begin_);
    float* mt = m_.as<float>() + (lo - begin_);
    float* vt = v_.as<float>() + (lo - begin_);
    const long n = static_cast<long>(hi - lo);
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; ++i) {
      float gi = g[i];
      float mi = b1 * mt[i] + (1.0f - b1) * gi;
      float vi = b2 * vt[i] + (1.0f - b2) * gi * gi;
      mt[i] = mi;
      vt[i] = vi;
      x[i] = x[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
  }
}

double sum_of_squares(const float* grads, size_t n) {
  // Fixed blocks summed in a fixed order: the result does not depend on the
  // number of threads, so runs with different thread counts agree bit for bit.
  constexpr size_t kBlock = 1 << 16;
  const size_t nblocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(nblocks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < nblocks; ++b) {
    double s = 0.0;
    const size_t end = std::min(n, (b + 1) * kBlock);
    for (size_t i = b * kBlock; i < end; ++i) s += static_cast<double>(grads[i]) * grads[i];
    partial[b] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

void clip_to_norm(float* grads, size_t n, double norm, double max_norm) {
  if (max_norm <= 0.0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return;
  const float c = static_cast<float>(coef);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) grads[i] *= c;
}

double clip_grad_norm(float* grads, size_t n, double max_norm) {
  const double norm = grad_norm(grads, n);
  clip_to_norm(grads, n, norm, max_norm);
  return norm;
}

}  // namespace meshlm
