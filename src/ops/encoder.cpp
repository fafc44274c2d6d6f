// Token + position embedding.
#include "ops/ops.h"
#include "ops/parallel.h"

namespace meshlm::ops {

template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tn,
                     int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      T* o = out + (static_cast<size_t>(b) * Tn + t) * C;
      const T* te = wte + static_cast<size_t>(tokens[b * Tn + t]) * C;
      const T* pe = wpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = te[c] + pe[c];
    }
  }
}

template <typename T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tn,
                      int C) {
  // Several positions may hold the same token, so rows of dwte are shared
  // between (b, t): each thread owns a slice of the channels instead, which
  // keeps every write private to one thread and the summation order fixed.
#pragma omp parallel
  {
    auto [c0, c1] = thread_range(C);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tn; ++t) {
        const T* d = dout + (static_cast<size_t>(b) * Tn + t) * C;
        T* te = dwte + static_cast<size_t>(tokens[b * Tn + t]) * C;
        T* pe = dwpe + static_cast<size_t>(t) * C;
        for (int c = c0; c < c1; ++c) {
          te[c] += d[c];
          pe[c] += d[c];
        }
      }
    }
  }
}

template void encoder_forward<float>(float*, const int32_t*, const float*, const float*, int, int, int);
template void encoder_forward<double>(double*, const int32_t*, const double*, const double*, int, int, int);
template void encoder_backward<float>(float*, float*, const float*, const int32_t*, int, int, int);
template void encoder_backward<double>(double*, double*, const double*, const int32_t*, int, int, int);

}  // namespace meshlm::ops
