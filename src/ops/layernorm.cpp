// LayerNorm over the channel dimension, eps = 1e-5 (GPT-2).
#include <cmath>

#include "ops/ops.h"
#include "ops/parallel.h"

namespace meshlm::ops {

namespace {
constexpr double kLayerNormEps = 1e-5;
}

// One row: out = (x - mean) * rstd * w + b.
template <typename T>
inline void layernorm_row(T* o, T* mean, T* rstd, const T* x, const T* w, const T* b, int C) {
  T m = 0;
  for (int c = 0; c < C; ++c) m += x[c];
  m /= C;
  T v = 0;
  for (int c = 0; c < C; ++c) {
    T d = x[c] - m;
    v += d * d;
  }
  v /= C;
  T s = T(1) / std::sqrt(v + T(kLayerNormEps));
  for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
  *mean = m;
  *rstd = s;
}

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int N,
                       int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t r = static_cast<size_t>(n) * C;
    layernorm_row(out + r, mean + n, rstd + n, inp + r, w, b, C);
  }
}

template <typename T>
void residual_layernorm_forward(T* res, T* out, T* mean, T* rstd, const T* a, const T* b,
                                const T* w, const T* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t r = static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) res[r + c] = a[r + c] + b[r + c];
    layernorm_row(out + r, mean + n, rstd + n, res + r, w, bias, C);
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                        const T* mean, const T* rstd, int N, int C) {
  // dinp: rows are independent. dw/db: sums over rows; each thread owns a
  // slice of the channels, so no atomics and a fixed summation order.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + static_cast<size_t>(n) * C;
    const T* g = dout + static_cast<size_t>(n) * C;
    T m = mean[n], s = rstd[n];
    // dxhat = g * w; dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    T sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int c = 0; c < C; ++c) {
      T xhat = (x[c] - m) * s;
      T dxhat = g[c] * w[c];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
    }
    T mean_dxhat = sum_dxhat / C, mean_dxhat_xhat = sum_dxhat_xhat / C;
    T* dx = dinp + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) {
      T xhat = (x[c] - m) * s;
      T dxhat = g[c] * w[c];
      dx[c] += s * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    }
  }
  if (dw == nullptr) return;  // frozen gain and bias (LoRA fine-tuning)
#pragma omp parallel
  {
    auto [c0, c1] = thread_range(C);
    for (int n = 0; n < N; ++n) {
      const T* g = dout + static_cast<size_t>(n) * C;
      const T* x = inp + static_cast<size_t>(n) * C;
      T m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; ++c) {
        dw[c] += g[c] * (x[c] - m) * s;
        db[c] += g[c];
      }
    }
  }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*, const double*, int, int);
template void residual_layernorm_forward<float>(float*, float*, float*, float*, const float*, const float*, const float*, const float*, int, int);
template void residual_layernorm_forward<double>(double*, double*, double*, double*, const double*, const double*, const double*, const double*, int, int);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*, const float*, int, int);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*, const double*, const double*, const double*, int, int);

}  // namespace meshlm::ops
