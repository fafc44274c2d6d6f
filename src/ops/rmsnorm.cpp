// RMSNorm over the channel dimension (Llama): out = inp * rstd * w, rstd =
// 1 / sqrt(mean(inp^2) + eps), computed in the op's type (fp32 in training,
// as Hugging Face's LlamaRMSNorm computes it), no bias.
#include <cmath>

#include "ops/ops.h"
#include "ops/parallel.h"

namespace meshlm::ops {

namespace {

// One row: out = w (x s), s = 1 / sqrt(mean(x^2) + eps), kept in *rstd.
template <typename T>
void rmsnorm_row(T* out, T* rstd, const T* x, const T* w, int C, double eps) {
  T ss = 0;
  for (int c = 0; c < C; ++c) ss += x[c] * x[c];
  const T s = T(1) / std::sqrt(ss / T(C) + T(eps));
  for (int c = 0; c < C; ++c) out[c] = w[c] * (x[c] * s);
  *rstd = s;
}

}  // namespace

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int N, int C, double eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t r = static_cast<size_t>(n) * C;
    rmsnorm_row(out + r, rstd + n, inp + r, w, C, eps);
  }
}

template <typename T>
void residual_rmsnorm_forward(T* res, T* out, T* rstd, const T* a, const T* b, const T* w, int N,
                              int C, double eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t r = static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) res[r + c] = a[r + c] + b[r + c];
    rmsnorm_row(out + r, rstd + n, res + r, w, C, eps);
  }
}

template <typename T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd,
                      int N, int C) {
  // With xhat = x s and s = (mean(x^2) + eps)^(-1/2):
  //   dx = s (g w - xhat mean(g w xhat)),   dw += sum over rows of g xhat.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t r = static_cast<size_t>(n) * C;
    const T *x = inp + r, *g = dout + r;
    const T s = rstd[n];
    T sum = 0;
    for (int c = 0; c < C; ++c) sum += g[c] * w[c] * (x[c] * s);
    const T mean = sum / T(C);
    for (int c = 0; c < C; ++c) dinp[r + c] += s * (g[c] * w[c] - (x[c] * s) * mean);
  }
  if (dw == nullptr) return;  // a frozen gain (LoRA fine-tuning)
  // Each thread owns a slice of the channels: no atomics, a fixed order.
#pragma omp parallel
  {
    auto [c0, c1] = thread_range(C);
    for (int n = 0; n < N; ++n) {
      const size_t r = static_cast<size_t>(n) * C;
      const T s = rstd[n];
      for (int c = c0; c < c1; ++c) dw[c] += dout[r + c] * (inp[r + c] * s);
    }
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int, double);
template void residual_rmsnorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int, double);
template void residual_rmsnorm_forward<double>(double*, double*, double*, const double*, const double*, const double*, int, int, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*, const double*, int, int);

}  // namespace meshlm::ops
