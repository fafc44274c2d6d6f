#include "ops/ops.h"

namespace meshlm::ops {

template <typename T>
void residual_forward(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void residual_backward(T* da, T* db, const T* dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

template void residual_forward<float>(float*, const float*, const float*, size_t);
template void residual_forward<double>(double*, const double*, const double*, size_t);
template void residual_backward<float>(float*, float*, const float*, size_t);
template void residual_backward<double>(double*, double*, const double*, size_t);

}  // namespace meshlm::ops
