// Linear layer through BLAS: out(N,OC) = inp(N,IC) w(OC,IC)^T + bias(OC).
#include "ops/blas.h"
#include "ops/ops.h"
#include "ops/parallel.h"

namespace meshlm::ops {

template <typename T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int IC, int OC,
                    Precision p) {
  T beta = 0;
  if (bias) {
    // Start from the bias and let the GEMM accumulate onto it (beta = 1).
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      T* o = out + static_cast<size_t>(n) * OC;
      for (int c = 0; c < OC; ++c) o[c] = bias[c];
    }
    beta = 1;
  }
  gemm(p, false, true, N, OC, IC, T(1), inp, IC, w, IC, beta, out, OC);
}

template <typename T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int N,
                     int IC, int OC, Precision p) {
  if (dinp) gemm(p, false, false, N, IC, OC, T(1), dout, OC, w, IC, T(0), dinp, IC);
  if (dw) gemm(p, true, false, OC, IC, N, T(1), dout, OC, inp, IC, T(1), dw, IC);
  if (dbias) {
#pragma omp parallel
    {
      auto [c0, c1] = thread_range(OC);
      for (int n = 0; n < N; ++n) {
        const T* g = dout + static_cast<size_t>(n) * OC;
        for (int c = c0; c < c1; ++c) dbias[c] += g[c];
      }
    }
  }
}

template void matmul_forward<float>(float*, const float*, const float*, const float*, int, int, int, Precision);
template void matmul_forward<double>(double*, const double*, const double*, const double*, int, int, int, Precision);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*, const float*, int, int, int, Precision);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*, const double*, int, int, int, Precision);

}  // namespace meshlm::ops
