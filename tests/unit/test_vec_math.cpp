// ops/vec_math.h against double-precision libm: exp_f32 over every float
// exponent of its range, its specials, the same bits vectorised as scalar;
// sigmoid_f32; and the float ops built on them against their double
// references (GELU where 1 + tanh cancels, SiLU) and xent_rows against the
// three cross-entropy ops it fuses, bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "ops/ops.h"
#include "ops/vec_math.h"

using namespace meshlm;

namespace {

constexpr double kMaxUlp = 2.0;  // exp_f32's documented bound

// |got - ref| in units of the last place of ref rounded to float.
double ulps(float got, double ref) {
  const float rf = static_cast<float>(ref);
  const double ulp = static_cast<double>(std::nextafter(rf, std::numeric_limits<float>::infinity())) - rf;
  return std::fabs(static_cast<double>(got) - ref) / ulp;
}

// Every float x in [lo, hi] whose bit pattern is a multiple of `stride`
// apart from lo's, walking away from zero on each side.
template <typename F>
void for_floats(float lo, float hi, uint32_t stride, F f) {
  for (float end : {lo, hi}) {
    const uint32_t last = std::bit_cast<uint32_t>(end) & 0x7fffffffu;
    const uint32_t sign = std::signbit(end) ? 0x80000000u : 0u;
    for (uint32_t m = 0; m <= last; m += stride) f(std::bit_cast<float>(sign | m));
  }
}

}  // namespace

TEST(VecMath, ExpWithinTwoUlpWhereTheResultIsNormal) {
  double worst = 0;
  float at = 0;
  size_t n = 0;
  for_floats(ops::kExpUnderflow, ops::kExpOverflow, 509, [&](float x) {
    const double e = ulps(ops::exp_f32(x), std::exp(static_cast<double>(x)));
    if (e > worst) worst = e, at = x;
    ++n;
  });
  EXPECT_GT(n, 4000000u);
  EXPECT_LE(worst, kMaxUlp) << "at x = " << at;
  // Exact where it must be.
  EXPECT_EQ(ops::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(ops::exp_f32(-0.0f), 1.0f);
}

TEST(VecMath, ExpSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(ops::exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(ops::exp_f32(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(ops::exp_f32(inf), inf);
  EXPECT_EQ(ops::exp_f32(-inf), 0.0f);
  EXPECT_EQ(ops::exp_f32(std::nextafter(ops::kExpOverflow, inf)), inf);
  EXPECT_EQ(ops::exp_f32(1000.0f), inf);
  // Just below the overflow bound: the largest finite results, not inf.
  EXPECT_TRUE(std::isfinite(ops::exp_f32(ops::kExpOverflow)));
  EXPECT_LE(ulps(ops::exp_f32(ops::kExpOverflow), std::exp(double(ops::kExpOverflow))), kMaxUlp);
  // Below the underflow bound: 0, where the true value is under 2^-125.
  EXPECT_EQ(ops::exp_f32(std::nextafter(ops::kExpUnderflow, -inf)), 0.0f);
  EXPECT_LT(std::exp(double(ops::kExpUnderflow)), std::ldexp(1.0, -124));
  EXPECT_EQ(ops::exp_f32(-200.0f), 0.0f);
  EXPECT_GT(ops::exp_f32(ops::kExpUnderflow), 0.0f);
}

// The loops of the ops call exp_f32 under `omp simd`: the vector code must
// give the scalar call's bits (no contraction or reordering of its steps).
TEST(VecMath, ExpVectorisedGivesTheScalarBits) {
  std::vector<float> x(1 << 16), vec(x.size()), scalar(x.size());
  Rng r(7);
  for (auto& v : x) v = static_cast<float>(40.0 * r.normal());
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = std::numeric_limits<float>::infinity();
  x[2] = -std::numeric_limits<float>::infinity();
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) vec[i] = ops::exp_f32(x[i]);
  for (size_t i = 0; i < x.size(); ++i) {
    volatile float xi = x[i];  // keeps this loop scalar
    scalar[i] = ops::exp_f32(xi);
  }
  EXPECT_EQ(std::memcmp(vec.data(), scalar.data(), x.size() * sizeof(float)), 0);
}

TEST(VecMath, Sigmoid) {
  double worst = 0;
  for (float x = -100.0f; x <= 100.0f; x += 0.01f) {
    const double ref = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    if (ref < 1e-37) continue;  // e^-x beyond float: 0 there (checked below)
    worst = std::max(worst, ulps(ops::sigmoid_f32(x), ref));
  }
  EXPECT_LE(worst, 4.0);  // exp's 2 ulp, an add and a division
  EXPECT_EQ(ops::sigmoid_f32(-200.0f), 0.0f);
  EXPECT_EQ(ops::sigmoid_f32(200.0f), 1.0f);
  EXPECT_TRUE(std::isnan(ops::sigmoid_f32(std::numeric_limits<float>::quiet_NaN())));
}

// The float GELU (sigmoid form) against GELU in double, element by element
// and relative to each value, also far into the negative tail where
// 1 + tanh(u) loses its digits (in double too, below x = -7: there the
// relative check takes x sigmoid(2u) in double); and against the double op
// (the tanh form) within float's rounding of values near 1.
TEST(VecMath, GeluFloatAgainstDoubleReference) {
  std::vector<double> xd;
  for (double x = -12.0; x <= 12.0; x += 1.0 / 64) xd.push_back(x);
  const size_t n = xd.size();
  std::vector<float> xf(xd.begin(), xd.end()), yf(n), gf(n), onesf(n, 1.0f);
  std::vector<double> x2(xf.begin(), xf.end()), yd(n), gd(n), onesd(n, 1.0);
  ops::gelu_forward(yf.data(), xf.data(), n);
  ops::gelu_forward(yd.data(), x2.data(), n);
  ops::gelu_backward(gf.data(), xf.data(), onesf.data(), n);
  ops::gelu_backward(gd.data(), x2.data(), onesd.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const double x = x2[i], u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    const double exact = x / (1.0 + std::exp(-2.0 * u));
    if (std::fabs(exact) > 1e-37) EXPECT_NEAR(yf[i] / exact, 1.0, 1e-5) << "gelu(" << x << ")";
    EXPECT_NEAR(yf[i], yd[i], 1e-6 * std::max(1.0, std::fabs(yd[i]))) << "gelu(" << x << ")";
    EXPECT_NEAR(gf[i], gd[i], 1e-6 * std::max(1.0, std::fabs(gd[i]))) << "gelu'(" << x << ")";
  }
  // NaN in, NaN out (never a finite number that hides it).
  float nan = std::numeric_limits<float>::quiet_NaN(), out = 0, one = 1;
  ops::gelu_forward(&out, &nan, 1);
  EXPECT_TRUE(std::isnan(out));
  ops::gelu_backward(&out, &nan, &one, 1);
  EXPECT_TRUE(std::isnan(out));
}

TEST(VecMath, SwiGluFloatAgainstDouble) {
  const int N = 3, F = 200;
  std::vector<double> g(N * F), u(N * F), d(N * F);
  Rng r(11);
  for (int i = 0; i < N * F; ++i) g[i] = 6.0 * r.normal(), u[i] = r.normal(), d[i] = r.normal();
  std::vector<float> gf(g.begin(), g.end()), uf(u.begin(), u.end()), df(d.begin(), d.end());
  std::vector<double> o(N * F), dg(N * F), du(N * F);
  std::vector<float> of(N * F), dgf(N * F), duf(N * F);
  ops::swiglu_forward(o.data(), g.data(), u.data(), N, F, F);
  ops::swiglu_forward(of.data(), gf.data(), uf.data(), N, F, F);
  ops::swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), N, F, F);
  ops::swiglu_backward(dgf.data(), duf.data(), df.data(), gf.data(), uf.data(), N, F, F);
  for (int i = 0; i < N * F; ++i) {
    EXPECT_NEAR(of[i], o[i], 2e-6 * std::max(1.0, std::fabs(o[i])));
    EXPECT_NEAR(dgf[i], dg[i], 2e-6 * std::max(1.0, std::fabs(dg[i])));
    EXPECT_NEAR(duf[i], du[i], 2e-6 * std::max(1.0, std::fabs(du[i])));
  }
}

// xent_rows is xent_local_max, xent_local_sums and xent_local_backward (one
// rank's whole vocabulary) bit for bit, with and without the backward.
template <typename T>
void expect_xent_rows_is_the_three_ops(int N, int V, int Vl) {
  std::vector<T> logits(static_cast<size_t>(N) * Vl), dl(N);
  std::vector<int32_t> tgt(N);
  Rng r(3);
  for (auto& x : logits) x = static_cast<T>(4.0 * r.normal());
  for (int n = 0; n < N; ++n) {
    tgt[n] = static_cast<int32_t>(r.below(V));
    dl[n] = static_cast<T>(r.normal());
    for (int v = V; v < Vl; ++v) logits[static_cast<size_t>(n) * Vl + v] = T(1000);  // padding
  }
  for (const bool backward : {false, true}) {
    std::vector<T> a = logits, b = logits, mx1(N), s1(2 * N), mx2(N), s2(2 * N);
    ops::xent_local_max(mx1.data(), a.data(), N, Vl, 0, V);
    ops::xent_local_sums(s1.data(), a.data(), mx1.data(), tgt.data(), N, Vl, 0, V);
    if (backward)
      ops::xent_local_backward(a.data(), mx1.data(), s1.data(), dl.data(), tgt.data(), N, Vl, 0, V);
    ops::xent_rows(b.data(), mx2.data(), s2.data(), backward ? dl.data() : nullptr, tgt.data(), N,
                   Vl, V);
    EXPECT_EQ(std::memcmp(mx1.data(), mx2.data(), N * sizeof(T)), 0) << "rowmax";
    EXPECT_EQ(std::memcmp(s1.data(), s2.data(), 2 * N * sizeof(T)), 0) << "sums";
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)), 0) << "logits/dlogits";
  }
}

TEST(VecMath, XentRowsIsTheThreeOps) {
  expect_xent_rows_is_the_three_ops<float>(5, 1000, 1024);
  expect_xent_rows_is_the_three_ops<float>(33, 64, 64);
  expect_xent_rows_is_the_three_ops<double>(4, 100, 128);
}
