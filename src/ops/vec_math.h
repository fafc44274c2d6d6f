// Elementary functions of float that the compiler can vectorise: plain
// arithmetic, comparisons and integer bit operations, no library calls, so
// that a `#pragma omp simd` loop calling them runs at the vector width
// (glibc's expf and tanhf are scalar calls unless the whole build is
// -ffast-math). The element-wise ops of a step (softmax and cross-entropy,
// GELU, SiLU) were bound by one libm call per element: 12-16 ns each on 2
// cores of the benchmark machine (docs/PERFORMANCE.md).
//
// Accuracy (tests/unit/test_vec_math.cpp checks it against double-precision
// std::exp over every float exponent): exp_f32 within 2 ulp of e^x where
// e^x is a normal float; 0 below kExpUnderflow (true results under
// 2.4e-38, so at most that in absolute error); +inf above kExpOverflow; NaN
// stays NaN. sigmoid_f32 and the GELU built on it inherit that relative
// accuracy. The double ops of ops.h, the references of the gradient checks,
// keep the library's functions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace meshlm::ops {

// The largest float whose e^x is a finite float (the next one, 88.7228394,
// lies above ln(FLT_MAX)): e^x is +inf above it.
inline constexpr float kExpOverflow = 88.72283172607421875f;
// Below this, e^x < 2^-125 is returned as 0: exp_f32 scales by 2^(n-1)
// (see there), a normal float only for n - 1 >= -126.
inline constexpr float kExpUnderflow = -86.64f;

// e^x: x = n ln2 + r with |r| <= ln2 / 2 (Cody and Waite's two-part ln2,
// exact without a fused multiply-add for |n| < 256), e^r by Cephes's
// degree-7 expansion (minimax on that interval), then 2^n from the exponent
// bits. NaN propagates: every select below keeps x when it compares false.
inline float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 16 low bits zero: n kLn2Hi exact
  constexpr float kLn2Lo = 1.428606765330187045e-06f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: t + kRound rounds t to an integer
  const float xc = x > kExpOverflow ? kExpOverflow : (x < kExpUnderflow ? kExpUnderflow : x);
  const float t = xc * kLog2e + kRound;
  const float n = t - kRound;  // round(x log2 e), exactly, as a float
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = (p * (r * r) + r) + 1.0f;  // e^r, in [0.70, 1.42]
  // 2^(n-1) times 2 e^r: n reaches 128 just below kExpOverflow, where 2^n
  // itself is no float. n is the integer held in t's low mantissa bits.
  const uint32_t ni = std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kRound);
  const float scale = std::bit_cast<float>((ni + 126u) << 23);
  const float y = (er + er) * scale;
  return x > kExpOverflow ? std::numeric_limits<float>::infinity()
                          : (x < kExpUnderflow ? 0.0f : y);
}

// 1 / (1 + e^-x): exactly 0 or 1 only where the true value rounds there.
inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

// e^x for an op written once for float and double: exp_f32 for float, the
// library's for double (the reference).
inline float exp_of(float x) { return exp_f32(x); }
inline double exp_of(double x) { return std::exp(x); }

}  // namespace meshlm::ops
