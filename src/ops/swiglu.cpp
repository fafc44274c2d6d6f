// SwiGLU (Llama's MLP): out = silu(gate) * up, silu(x) = x / (1 + e^-x),
// e^x vectorised in float (ops/vec_math.h).
#include <cmath>

#include "ops/ops.h"
#include "ops/vec_math.h"

namespace meshlm::ops {

template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int N, int F, size_t ld) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T *g = gate + static_cast<size_t>(n) * ld, *u = up + static_cast<size_t>(n) * ld;
    T* o = out + static_cast<size_t>(n) * F;
#pragma omp simd
    for (int f = 0; f < F; ++f) o[f] = g[f] / (T(1) + exp_of(-g[f])) * u[f];
  }
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int N, int F,
                     size_t ld) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t r = static_cast<size_t>(n) * ld;
    const T* d = dout + static_cast<size_t>(n) * F;
#pragma omp simd
    for (int f = 0; f < F; ++f) {
      const T x = gate[r + f], sig = T(1) / (T(1) + exp_of(-x));
      // silu'(x) = sig (1 + x (1 - sig))
      dgate[r + f] = d[f] * up[r + f] * sig * (T(1) + x * (T(1) - sig));
      dup[r + f] = d[f] * x * sig;
    }
  }
}

template void swiglu_forward<float>(float*, const float*, const float*, int, int, size_t);
template void swiglu_forward<double>(double*, const double*, const double*, int, int, size_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*, int, int, size_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*, const double*, int, int, size_t);

}  // namespace meshlm::ops
