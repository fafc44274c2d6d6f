// GELU, tanh approximation, as in GPT-2 (torch: approximate='tanh').
//
// With u = sqrt(2/pi) (x + 0.044715 x^3), 0.5 (1 + tanh(u)) = sigmoid(2u),
// so GELU(x) = x sigmoid(2u) and GELU'(x) = s + 2 x s (1 - s) du/dx, s =
// sigmoid(2u). The double ops, the references of the gradient checks, spell
// the tanh form; the float ops the sigmoid form, whose e^x vectorises
// (ops/vec_math.h) and which keeps GELU's relative accuracy where 1 + tanh(u)
// cancels (x < -3). Each element is read and written once: the op runs at
// the memory's rate, not at one libm tanhf per element.
#include <cmath>

#include "ops/ops.h"
#include "ops/vec_math.h"

namespace meshlm::ops {

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;

// The readable reference.
inline double gelu_of(double x) {
  const double u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
inline double gelu_grad_of(double x) {
  const double u = kGeluScale * (x + kGeluCubic * x * x * x);
  const double th = std::tanh(u);
  const double du_dx = kGeluScale * (1.0 + 3.0 * kGeluCubic * x * x);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du_dx;
}

// e^-2u of x: sigmoid(2u) = 1 / (1 + e^-2u), and 1 - s = e^-2u s, which
// keeps its digits where s is near 1 (1 - s would cancel).
inline float gelu_exp(float x) {
  constexpr float k2 = static_cast<float>(2 * kGeluScale);
  constexpr float k2c = static_cast<float>(2 * kGeluScale * kGeluCubic);
  return exp_f32(-x * (k2 + k2c * (x * x)));
}
inline float gelu_of(float x) { return x / (1.0f + gelu_exp(x)); }
inline float gelu_grad_of(float x) {
  // 2 du/dx = 2 sqrt(2/pi) (1 + 3 0.044715 x^2)
  constexpr float kd = static_cast<float>(2 * kGeluScale);
  constexpr float kdc = static_cast<float>(6 * kGeluScale * kGeluCubic);
  const float e = gelu_exp(x), s = 1.0f / (1.0f + e);
  const float q = e > 1e30f ? 1.0f : e * s;  // 1 - s; e * s is inf * 0 once e overflows
  return s + x * (s * q) * (kd + kdc * (x * x));
}
}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = gelu_of(inp[i]);
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) dinp[i] = gelu_grad_of(inp[i]) * dout[i];
}

template void gelu_forward<float>(float*, const float*, size_t);
template void gelu_forward<double>(double*, const double*, size_t);
template void gelu_backward<float>(float*, const float*, const float*, size_t);
template void gelu_backward<double>(double*, const double*, const double*, size_t);

}  // namespace meshlm::ops
