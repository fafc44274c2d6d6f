// GELU, tanh approximation, as in GPT-2 (torch: approximate='tanh').
#include <cmath>

#include "ops/ops.h"

namespace meshlm::ops {

namespace {
template <typename T>
constexpr T kGeluScale = T(0.7978845608028654);  // sqrt(2/pi)
}

template <typename T>
void gelu_forward(T* out, const T* inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    T x = inp[i];
    T u = kGeluScale<T> * (x + T(0.044715) * x * x * x);
    out[i] = T(0.5) * x * (T(1) + std::tanh(u));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    T x = inp[i];
    T u = kGeluScale<T> * (x + T(0.044715) * x * x * x);
    T th = std::tanh(u);
    T sech2 = T(1) - th * th;
    T du_dx = kGeluScale<T> * (T(1) + T(3) * T(0.044715) * x * x);
    T grad = T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * du_dx;
    dinp[i] = grad * dout[i];
  }
}

template void gelu_forward<float>(float*, const float*, size_t);
template void gelu_forward<double>(double*, const double*, size_t);
template void gelu_backward<float>(float*, const float*, const float*, size_t);
template void gelu_backward<double>(double*, const double*, const double*, size_t);

}  // namespace meshlm::ops
