// Rotary position embeddings (Llama), in Hugging Face's rotate-half
// convention: channel i of a head's first half turns with channel i + HS/2
// by the angle t * inv_freq[i] of position t.
#include <cmath>

#include "ops/ops.h"

namespace meshlm::ops {

void rope_inv_freq(float* inv_freq, int HS, double theta, const RopeScaling& s) {
  const int half = HS / 2;
  for (int i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta),
                                  static_cast<float>(2 * i) / static_cast<float>(HS));
  if (s.factor <= 0) return;
  // llama3: wavelengths longer than the original context / low_freq_factor
  // are slowed by `factor`; shorter than it / high_freq_factor kept; those
  // between blend the two smoothly. In float, as the reference computes it.
  const float factor = static_cast<float>(s.factor), lo = static_cast<float>(s.low_freq_factor),
              hi = static_cast<float>(s.high_freq_factor),
              old_len = static_cast<float>(s.original_max_positions);
  const float low_wavelen = old_len / lo, high_wavelen = old_len / hi;
  const float two_pi = 2.0f * static_cast<float>(M_PI);
  for (int i = 0; i < half; ++i) {
    const float f = inv_freq[i], wavelen = two_pi / f;
    if (wavelen > low_wavelen) {
      inv_freq[i] = f / factor;
    } else if (wavelen >= high_wavelen) {
      const float smooth = (old_len / wavelen - lo) / (hi - lo);
      inv_freq[i] = (1.0f - smooth) * f / factor + smooth * f;
    }
  }
}

template <typename T>
void rope_tables(T* cos, T* sin, const float* inv_freq, int Tn, int HS) {
  const int half = HS / 2;
  for (int t = 0; t < Tn; ++t)
    for (int i = 0; i < half; ++i) {
      // The angle as a float product, as the reference forms it.
      const float angle = static_cast<float>(t) * inv_freq[i];
      cos[static_cast<size_t>(t) * half + i] = static_cast<T>(std::cos(static_cast<double>(angle)));
      sin[static_cast<size_t>(t) * half + i] = static_cast<T>(std::sin(static_cast<double>(angle)));
    }
}

namespace {

// Rotates every head of every row by +angle (dir = 1) or -angle (dir = -1).
template <typename T>
void rotate(T* x, const T* cos, const T* sin, int B, int Tn, int heads, int HS, size_t ld,
            int dir) {
  const int half = HS / 2;
  const long long rows = static_cast<long long>(B) * Tn;
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < rows; ++r) {
    const int t = static_cast<int>(r % Tn);
    const T* c = cos + static_cast<size_t>(t) * half;
    const T* s = sin + static_cast<size_t>(t) * half;
    for (int h = 0; h < heads; ++h) {
      T* v = x + static_cast<size_t>(r) * ld + static_cast<size_t>(h) * HS;
      for (int i = 0; i < half; ++i) {
        const T a = v[i], b = v[i + half], si = dir > 0 ? s[i] : -s[i];
        v[i] = a * c[i] - b * si;
        v[i + half] = b * c[i] + a * si;
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_forward(T* x, const T* cos, const T* sin, int B, int Tn, int heads, int HS, size_t ld) {
  rotate(x, cos, sin, B, Tn, heads, HS, ld, 1);
}

template <typename T>
void rope_backward(T* dx, const T* cos, const T* sin, int B, int Tn, int heads, int HS,
                   size_t ld) {
  rotate(dx, cos, sin, B, Tn, heads, HS, ld, -1);  // a rotation's transpose is its inverse
}

template void rope_tables<float>(float*, float*, const float*, int, int);
template void rope_tables<double>(double*, double*, const float*, int, int);
template void rope_forward<float>(float*, const float*, const float*, int, int, int, int, size_t);
template void rope_forward<double>(double*, const double*, const double*, int, int, int, int, size_t);
template void rope_backward<float>(float*, const float*, const float*, int, int, int, int, size_t);
template void rope_backward<double>(double*, const double*, const double*, int, int, int, int, size_t);

}  // namespace meshlm::ops
