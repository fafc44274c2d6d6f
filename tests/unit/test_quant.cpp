// The block formats (quant/formats.h), their CPU reference (quant/quantize.h)
// and the quantized linear layer (quant/qlinear.h). The format itself is
// checked against an independent Python implementation by
// tests/torch/check_nf4.py.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "ops/kernels.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "quant/dequantizer.h"
#include "quant/formats.h"
#include "quant/qlinear.h"
#include "quant/quantize.h"

using namespace meshlm;
using namespace meshlm::quant;

namespace {

// ---- tolerances -----------------------------------------------------------------
//
// int8: rounding to the nearest step of absmax/127 leaves at most half a step,
// absmax/254. In fp32 the code comes from y = fl(fl(x/absmax) * 127), within
// 127 * 2^-23 of the exact y, so it may round the wrong way that close to a
// half; dequantization fl(q * fl(absmax/127)) adds at most absmax * 2^-23.
// Together: |x - x'| <= absmax/254 * (1 + 508 * 2^-23) = absmax/254 * (1 + 6.1e-5).
constexpr double kQ8BoundSlack = 1e-4;
// nf4: the nearest level is at most half the largest gap between adjacent
// levels away from x / absmax; the largest gap is the first, [-1, L1].
constexpr double kNF4HalfMaxGap = (kNF4Levels[1] - kNF4Levels[0]) / 2.0;  // 0.1519
// nf4, per element of block b in group g:
//   |x - x'| <= absmax_b * kNF4HalfMaxGap      (nearest level, |level| <= 1)
//             + absmax2_g / 254                (|absmax_b - absmax'_b|: half a step
//                                              of the double quantization)
//             + kNF4RoundSlack * (absmax_b + absmax2_g)
// The last term covers fp32 rounding: x / absmax, the level product, the
// double-quantized code (within 3 * 127 * 2^-24 steps of exact) and the fused
// absmax' (2^-24 each): about 5 * 2^-24 = 3e-7 of absmax_b + absmax2_g.
constexpr double kNF4RoundSlack = 1e-6;
// Quantized linear layer vs ops::matmul on the dequantized matrix: the same
// products summed in another order (per tile). Relative to the largest |ref|.
constexpr double kQLinearTol = 1e-5;

// A quantized tensor with its own memory. The memory starts as garbage, so a
// byte the quantizer forgets to write shows up.
struct Owned {
  QLayout layout;
  std::vector<uint8_t> mem;
  QTensor t;
  Owned(QuantType type, size_t n) : layout(qlayout(type, n)), mem(layout.total_bytes, 0xCD) {
    t = qtensor_at(layout, mem.data());
  }
};

std::vector<float> randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * r.normal());
  return v;
}

std::vector<float> roundtrip(const Owned& q, const std::vector<float>& x) {
  quantize_ref(x.data(), q.t);
  std::vector<float> y(x.size());
  dequantize_ref(q.t, 0, x.size(), y.data());
  return y;
}

float absmax_of(const std::vector<float>& x, size_t i0, size_t i1) {
  float m = 0;
  for (size_t i = i0; i < i1; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

struct ErrStats {
  double max_ratio = 0;  // max over elements of |x - x'| / (the bound without its slack)
  double max_rel = 0;    // max over elements of |x - x'| / absmax of the block
  double rms_err = 0, rms_x = 0;
};

// Checks the int8 bound on every element; returns the measured errors.
ErrStats check_q8(const std::vector<float>& x, const std::vector<float>& y, const QTensor& t) {
  ErrStats s;
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t b = i / kQ8Block;
    const float a = absmax_of(x, b * kQ8Block, std::min(x.size(), (b + 1) * kQ8Block));
    EXPECT_EQ(t.absmax[b], a) << "block " << b;
    const double err = std::fabs(static_cast<double>(x[i]) - y[i]);
    const double half_step = a / 254.0;
    EXPECT_LE(err, half_step * (1 + kQ8BoundSlack)) << "element " << i << " x " << x[i];
    if (half_step > 0) s.max_ratio = std::max(s.max_ratio, err / half_step);
    if (a > 0) s.max_rel = std::max(s.max_rel, err / a);
    s.rms_err += err * err;
    s.rms_x += static_cast<double>(x[i]) * x[i];
  }
  s.rms_err = std::sqrt(s.rms_err / x.size());
  s.rms_x = std::sqrt(s.rms_x / x.size());
  return s;
}

// Checks the nf4 bound on every element, and that every code is the level
// nearest to x / absmax; returns the measured errors.
ErrStats check_nf4(const std::vector<float>& x, const std::vector<float>& y, const QTensor& t) {
  ErrStats s;
  size_t not_nearest = 0;
  const uint8_t* packed = static_cast<const uint8_t*>(t.data);
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t b = i / kNF4Block;
    const float a = absmax_of(x, b * kNF4Block, std::min(x.size(), (b + 1) * kNF4Block));
    const double a2 = t.absmax2[b / kNF4AbsmaxBlock];
    const double err = std::fabs(static_cast<double>(x[i]) - y[i]);
    const double bound = a * kNF4HalfMaxGap + a2 / 254.0;
    EXPECT_LE(err, bound + kNF4RoundSlack * (a + a2)) << "element " << i << " x " << x[i];
    if (bound > 0) s.max_ratio = std::max(s.max_ratio, err / bound);
    if (a > 0) s.max_rel = std::max(s.max_rel, err / a);
    if (a > 0) {
      const double v = static_cast<double>(x[i]) / a;
      const uint8_t c = nf4_code_at(packed, i);
      for (int k = 0; k < 16; ++k)
        if (std::fabs(v - kNF4Levels[c]) > std::fabs(v - kNF4Levels[k]) + 1e-6 &&
            not_nearest++ == 0)
          ADD_FAILURE() << "element " << i << ": code " << int(c) << " is not the nearest level";
    }
    s.rms_err += err * err;
    s.rms_x += static_cast<double>(x[i]) * x[i];
  }
  s.rms_err = std::sqrt(s.rms_err / x.size());
  s.rms_x = std::sqrt(s.rms_x / x.size());
  EXPECT_EQ(not_nearest, 0u);
  return s;
}

ErrStats check(QuantType type, const std::vector<float>& x, const std::vector<float>& y,
               const QTensor& t) {
  if (type == QuantType::int8) return check_q8(x, y, t);
  if (type == QuantType::nf4) return check_nf4(x, y, t);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], y[i]);
  return {};
}

constexpr QuantType kAllTypes[] = {QuantType::f32, QuantType::int8, QuantType::nf4};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// ---- the formats ------------------------------------------------------------------

TEST(QuantFormats, LevelsSortedWithExactZeroAndEnds) {
  EXPECT_EQ(kNF4Levels[0], -1.0f);
  EXPECT_EQ(kNF4Levels[15], 1.0f);
  EXPECT_EQ(kNF4Levels[kNF4ZeroCode], 0.0f);
  for (int c = 1; c < 16; ++c) EXPECT_LT(kNF4Levels[c - 1], kNF4Levels[c]);
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(nf4_level(static_cast<uint8_t>(c)), kNF4Levels[c]);
    EXPECT_EQ(nf4_nearest(kNF4Levels[c]), c);
  }
  // The largest gap is the first one, which kNF4HalfMaxGap relies on.
  for (int c = 2; c < 16; ++c) EXPECT_LT(kNF4Levels[c] - kNF4Levels[c - 1], 2 * kNF4HalfMaxGap);
  // Beyond the ends: the end levels.
  EXPECT_EQ(nf4_nearest(2.0f), 15);
  EXPECT_EQ(nf4_nearest(-2.0f), 0);
}

TEST(QuantFormats, NearestTiesGoToTheLowerCode) {
  // For every adjacent pair, the fp32 value whose fp32 distances to both
  // levels are equal, if one exists, must take the lower code.
  int ties = 0;
  for (int c = 0; c < 15; ++c) {
    // The 9 fp32 values nearest the midpoint of levels c and c + 1.
    float w = (kNF4Levels[c] + kNF4Levels[c + 1]) / 2;
    for (int k = 0; k < 4; ++k) w = std::nextafter(w, -2.0f);
    for (int k = 0; k < 9; ++k, w = std::nextafter(w, 2.0f)) {
      const float dl = std::fabs(w - kNF4Levels[c]), dh = std::fabs(w - kNF4Levels[c + 1]);
      EXPECT_EQ(nf4_nearest(w), dh < dl ? c + 1 : c) << "between codes " << c << " and " << c + 1;
      ties += dl == dh;
    }
  }
  EXPECT_GT(ties, 0) << "no exact tie exercised";
}

TEST(QuantFormats, OneTableGivesNamesAndReferences) {
  for (QuantType t : kAllTypes) {
    EXPECT_EQ(enum_from_name<QuantType>(name_of(t)), t);
    EXPECT_EQ(quant_format(t).type, t);
  }
  EXPECT_STREQ(name_of(QuantType::nf4), "nf4");
  EXPECT_FALSE(enum_from_name<QuantType>("fp16").has_value());
  EXPECT_EQ(enum_choices<QuantType>(), "nf4 | int8 | f32");
  // The table's figures are the formats' own (formats.h).
  EXPECT_EQ(quant_format(QuantType::int8).block, kQ8Block);
  EXPECT_EQ(quant_format(QuantType::nf4).absmax_group, kNF4AbsmaxBlock);
  EXPECT_DOUBLE_EQ(quant_format(QuantType::int8).bits_per_weight, 8.5);
  // The stored bits of a large tensor approach the table's figure.
  for (QuantType t : kAllTypes) {
    const size_t n = size_t{64} * 256 * 64;
    EXPECT_NEAR(qlayout(t, n).bits_per_weight(), quant_format(t).bits_per_weight, 1e-3)
        << name_of(t);
  }
}

// ---- layout -------------------------------------------------------------------

TEST(QuantLayout, ArraysAlignedInOrderAndSized) {
  for (QuantType type : kAllTypes) {
    for (size_t n : {size_t(1), size_t(63), size_t(64), size_t(65), size_t(64 * 256 * 2 + 3)}) {
      const QLayout L = qlayout(type, n);
      SCOPED_TRACE(std::string(name_of(type)) + " n=" + std::to_string(n));
      ASSERT_GT(L.narrays, 0);
      EXPECT_STREQ(L.arrays[0].name, "data");
      size_t end = 0;
      for (int k = 0; k < L.narrays; ++k) {
        const QArray& a = L.arrays[k];
        EXPECT_EQ(a.offset % kQAlign, 0u) << a.name;
        EXPECT_GE(a.offset, end) << a.name;
        EXPECT_GT(a.count, 0u) << a.name;
        EXPECT_EQ(L.find(a.name), &a);
        end = a.offset + a.bytes();
      }
      EXPECT_LE(end, L.total_bytes);
      EXPECT_EQ(L.total_bytes % kQAlign, 0u);
      const size_t nb = (n + 63) / 64;
      switch (type) {
        case QuantType::f32:
          EXPECT_EQ(L.find("data")->count, n);
          EXPECT_EQ(L.find("data")->elem, DType::f32);
          EXPECT_EQ(L.find("absmax"), nullptr);
          break;
        case QuantType::int8:
          EXPECT_EQ(L.find("data")->count, n);
          EXPECT_EQ(L.find("data")->elem, DType::i8);
          EXPECT_EQ(L.find("absmax")->count, nb);
          EXPECT_EQ(L.find("absmax")->elem, DType::f32);
          EXPECT_EQ(L.find("absmax2"), nullptr);
          break;
        case QuantType::nf4:
          EXPECT_EQ(L.find("data")->count, (n + 1) / 2);
          EXPECT_EQ(L.find("data")->elem, DType::u8);
          EXPECT_EQ(L.find("absmax")->count, nb);
          EXPECT_EQ(L.find("absmax")->elem, DType::i8);
          EXPECT_EQ(L.find("absmax2")->count, (nb + 255) / 256);
          EXPECT_EQ(L.find("absmax2")->elem, DType::f32);
          EXPECT_EQ(L.find("offset")->count, 1u);
          break;
      }
    }
  }
}

TEST(QuantLayout, BitsPerWeightOfALargeTensor) {
  const size_t n = size_t(1) << 24;  // a 4096 x 4096 matrix
  const double f32 = qlayout(QuantType::f32, n).bits_per_weight();
  const double q8 = qlayout(QuantType::int8, n).bits_per_weight();
  const double nf4 = qlayout(QuantType::nf4, n).bits_per_weight();
  std::printf("# bits per weight, n = 2^24: f32 %.6f  int8 %.6f (format %.6f)  "
              "nf4 %.6f (format %.6f)\n",
              f32, q8, kQ8BitsPerWeight, nf4, kNF4BitsPerWeight);
  EXPECT_EQ(f32, 32.0);
  EXPECT_NEAR(q8, kQ8BitsPerWeight, 1e-4);
  EXPECT_NEAR(nf4, kNF4BitsPerWeight, 1e-4);
  EXPECT_GE(nf4, kNF4BitsPerWeight);
}

// ---- round trips ------------------------------------------------------------------

TEST(QuantRoundTrip, RandomNormalWithinBounds) {
  const size_t n = (size_t(1) << 20) + 37;  // 4097 nf4 groups' worth of blocks, a short tail
  const auto x = randn(n, 7);
  for (QuantType type : kAllTypes) {
    SCOPED_TRACE(name_of(type));
    Owned q(type, n);
    const auto y = roundtrip(q, x);
    const ErrStats s = check(type, x, y, q.t);
    std::printf("# %-4s n=%zu: max |x - x'| / bound %.6f, / absmax %.3e; "
                "rms(x - x') / rms(x) %.3e; %.4f bits/weight\n",
                name_of(type), n, s.max_ratio, s.max_rel,
                s.rms_err / std::max(s.rms_x, 1e-30), q.layout.bits_per_weight());
  }
}

TEST(QuantRoundTrip, EdgeCases) {
  struct Case {
    const char* what;
    std::vector<float> x;
  };
  std::vector<Case> cases;
  cases.push_back({"zeros", std::vector<float>(200, 0.0f)});
  cases.push_back({"n = 1 positive", {3.5f}});
  cases.push_back({"n = 1 negative", {-0.125f}});
  cases.push_back({"n = 2", {1.0f, -2.0f}});
  cases.push_back({"n = 3 (odd)", {0.5f, -0.25f, 0.125f}});
  {
    // Constant blocks of different values and signs, a zero block, a block
    // with one non-zero, and a tail of 5.
    std::vector<float> x;
    for (float c : {0.75f, -3.0f, 0.0f, 1e-3f}) x.insert(x.end(), 64, c);
    std::vector<float> one(64, 0.0f);
    one[17] = -6.0f;
    x.insert(x.end(), one.begin(), one.end());
    x.insert(x.end(), 5, 2.0f);
    cases.push_back({"constant blocks, short tail", x});
  }
  cases.push_back({"tail shorter than a block", randn(64 * 3 + 5, 11)});
  cases.push_back({"huge magnitudes", randn(64 * 5 + 9, 12, 1e37)});
  {
    auto x = randn(64 * 4, 13, 1e37);
    x[70] = 3.0e38f;  // close to FLT_MAX: absmax / 127 must be formed first
    x[200] = -3.3e38f;
    cases.push_back({"near FLT_MAX", x});
  }
  cases.push_back({"tiny magnitudes", randn(64 * 5 + 9, 14, 1e-30)});
  {
    // Blocks of very different scales in one tensor: the double quantization
    // is coarse for the small ones, and the bound says by how much.
    auto x = randn(64 * 300, 15);
    for (size_t i = 0; i < x.size(); ++i) x[i] *= std::pow(10.0f, float(i / 64 % 7) - 3);
    cases.push_back({"mixed block scales", x});
  }
  for (QuantType type : kAllTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(name_of(type)) + ": " + c.what);
      Owned q(type, c.x.size());
      const auto y = roundtrip(q, c.x);
      for (float v : y) ASSERT_TRUE(std::isfinite(v));
      check(type, c.x, y, q.t);
      // Zero blocks come back exactly zero in every format.
      static_assert(kQ8Block == kNF4Block);
      for (size_t i = 0; i < c.x.size(); ++i) {
        const size_t b0 = i / kQ8Block * kQ8Block;
        if (absmax_of(c.x, b0, std::min(c.x.size(), b0 + kQ8Block)) == 0)
          EXPECT_EQ(y[i], 0.0f) << "element " << i;
      }
    }
  }
}

TEST(QuantRoundTrip, SingleBlockNF4IsExactOnLevels) {
  // One block: offset = absmax, absmax2 = 0, so absmax' = absmax exactly,
  // and values on the levels come back bit for bit.
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = 2.0f * kNF4Levels[i % 16];
  Owned q(QuantType::nf4, x.size());
  const auto y = roundtrip(q, x);
  EXPECT_TRUE(same_bits(x, y));
  // n = 1 in either sign is exact too.
  for (float v : {5.0f, -5.0f}) {
    Owned one(QuantType::nf4, 1);
    EXPECT_EQ(roundtrip(one, {v})[0], v);
  }
}

TEST(QuantPacking, NF4NibblesByteByByte) {
  // Element e = 2 * L[e % 16]: absmax 2, x / absmax exactly on level e % 16,
  // so the codes are 0, 1, ..., 15, 0, 1, ... and byte j holds element 2j in
  // its high nibble: 0x01, 0x23, 0x45, ..., 0xEF, 0x01, ...
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = 2.0f * kNF4Levels[i % 16];
  Owned q(QuantType::nf4, x.size());
  quantize_ref(x.data(), q.t);
  const uint8_t* p = static_cast<const uint8_t*>(q.t.data);
  const uint8_t expect[8] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF};
  for (int j = 0; j < 32; ++j) EXPECT_EQ(p[j], expect[j % 8]) << "byte " << j;
  EXPECT_EQ(*q.t.offset, 2.0f);
  EXPECT_EQ(q.t.absmax2[0], 0.0f);
  EXPECT_EQ(q.t.absmax_q[0], 0);

  // Odd n: the last low nibble is 0. Levels 15, 0, 7 (x = absmax, -absmax, 0).
  Owned odd(QuantType::nf4, 3);
  const float y[3] = {4.0f, -4.0f, 0.0f};
  quantize_ref(y, odd.t);
  const uint8_t* po = static_cast<const uint8_t*>(odd.t.data);
  EXPECT_EQ(po[0], 0xF0);
  EXPECT_EQ(po[1], 0x70);

  // A zero block is all code 7.
  Owned zero(QuantType::nf4, 64);
  std::vector<float> z(64, 0.0f);
  quantize_ref(z.data(), zero.t);
  for (int j = 0; j < 32; ++j)
    EXPECT_EQ(static_cast<const uint8_t*>(zero.t.data)[j], 0x77) << "byte " << j;
}

TEST(QuantPacking, NF4DoubleQuantizationByHand) {
  // Three blocks of absmax 1, 2 and 4: offset 7/3, absmax2 = 4 - 7/3 = 5/3,
  // codes round(127 * (-4/3) / (5/3)) = round(-101.6) = -102,
  //       round(127 * (-1/3) / (5/3)) = round(-25.4)  = -25,
  //       round(127 * (5/3) / (5/3))  = 127.
  std::vector<float> x(64 * 3, 0.0f);
  x[0] = 1.0f;
  x[64 + 9] = -2.0f;
  x[128 + 63] = 4.0f;
  Owned q(QuantType::nf4, x.size());
  quantize_ref(x.data(), q.t);
  EXPECT_EQ(*q.t.offset, static_cast<float>(7.0 / 3.0));
  EXPECT_EQ(q.t.absmax2[0], 4.0f - static_cast<float>(7.0 / 3.0));
  EXPECT_EQ(q.t.absmax_q[0], -102);
  EXPECT_EQ(q.t.absmax_q[1], -25);
  EXPECT_EQ(q.t.absmax_q[2], 127);
  // absmax' = code * absmax2 / 127 + offset
  std::vector<float> y(x.size());
  dequantize_ref(q.t, 0, x.size(), y.data());
  EXPECT_NEAR(y[0], 7.0 / 3 - 102 * (5.0 / 3) / 127, 1e-6);
  EXPECT_NEAR(y[64 + 9], -(7.0 / 3 - 25 * (5.0 / 3) / 127), 1e-6);
  EXPECT_NEAR(y[128 + 63], 4.0, 1e-6);
}

TEST(QuantPacking, Int8CodesByHand) {
  // absmax 127: q = round(x), half away from zero; x' = q.
  std::vector<float> x = {127.0f, -127.0f, 0.5f, -0.5f, 1.49f, -2.5f, 0.0f, 63.5f};
  Owned q(QuantType::int8, x.size());
  quantize_ref(x.data(), q.t);
  const int8_t* c = static_cast<const int8_t*>(q.t.data);
  const int8_t expect[] = {127, -127, 1, -1, 1, -3, 0, 64};
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(c[i], expect[i]) << "element " << i;
  EXPECT_EQ(q.t.absmax[0], 127.0f);
}

TEST(QuantRoundTrip, SameBytesWithOneOrTwoThreads) {
  const auto x = randn(64 * 256 * 3 + 100, 21);
  const int keep = omp_get_max_threads();
  for (QuantType type : kAllTypes) {
    Owned a(type, x.size()), b(type, x.size());
    std::fill(a.mem.begin(), a.mem.end(), 0);
    std::fill(b.mem.begin(), b.mem.end(), 0);
    omp_set_num_threads(1);
    quantize_ref(x.data(), a.t);
    omp_set_num_threads(std::max(2, keep));
    quantize_ref(x.data(), b.t);
    EXPECT_EQ(a.mem, b.mem) << name_of(type);
  }
  omp_set_num_threads(keep);
}

TEST(QuantRoundTrip, AnyRangeEqualsTheSameSliceOfTheWhole) {
  const size_t n = 64 * 7 + 37;
  const auto x = randn(n, 31);
  Rng r(5);
  for (QuantType type : kAllTypes) {
    SCOPED_TRACE(name_of(type));
    Owned q(type, n);
    const auto whole = roundtrip(q, x);
    std::vector<std::pair<size_t, size_t>> ranges = {
        {0, 0}, {0, n}, {1, 1}, {63, 2}, {64, 64}, {64, 65}, {3, 200}, {127, 129},
        {n - 37, 37}, {n - 1, 1}, {n, 0}, {n - 38, 38}, {5, n - 5}};
    for (int k = 0; k < 300; ++k) {
      const size_t first = r.below(n + 1);
      ranges.push_back({first, r.below(n - first + 1)});
    }
    for (auto [first, count] : ranges) {
      std::vector<float> part(count + 1, -7.0f);
      dequantize_ref(q.t, first, count, part.data());
      ASSERT_EQ(std::memcmp(part.data(), whole.data() + first, count * sizeof(float)), 0)
          << "range [" << first << ", " << first + count << ")";
      ASSERT_EQ(part[count], -7.0f) << "wrote past the range";
    }
    std::vector<float> out(2);
    EXPECT_THROW(dequantize_ref(q.t, n - 1, 2, out.data()), RankError);
  }
}

TEST(BlockQuantizer, RangesOfAnyBlockCountGiveTheBytesOfTheWholeTensor) {
  // n is not a multiple of 64, and nf4's absmax spans more than one group of
  // 256 blocks: the offset and absmax2 come from every range's blocks.
  const size_t n = 64 * 256 * 2 + 64 * 5 + 13;
  // Two tensors of very different scale in one: a range's absmax alone would
  // give another offset than the whole tensor's.
  auto x = randn(n, 41);
  for (size_t i = n / 2; i < n; ++i) x[i] *= 50.0f;
  for (QuantType type : kAllTypes) {
    SCOPED_TRACE(name_of(type));
    Owned whole(type, n);
    quantize_ref(x.data(), whole.t);
    for (size_t step : {size_t{64}, size_t{64 * 3}, size_t{64 * 256}, size_t{64 * 300}, n}) {
      Owned parts(type, n);
      BlockQuantizer q(parts.t);
      for (size_t first = 0; first < n; first += step)
        q.add(x.data() + first, first, std::min(step, n - first));
      q.finish();
      ASSERT_EQ(parts.mem, whole.mem) << step << " elements a range";
    }
  }
}

TEST(BlockQuantizer, KeepsNf4AbsmaxInTheWorkspaceAndRefusesRangesOutOfOrder) {
  const size_t n = 64 * 10;
  const auto x = randn(n, 43);
  EXPECT_EQ(BlockQuantizer::absmax_bytes(QuantType::nf4, n), 10 * sizeof(float));
  EXPECT_EQ(BlockQuantizer::absmax_bytes(QuantType::nf4, n + 1), 11 * sizeof(float));
  EXPECT_EQ(BlockQuantizer::absmax_bytes(QuantType::int8, n), 0u);
  EXPECT_EQ(BlockQuantizer::absmax_bytes(QuantType::f32, n), 0u);
  for (QuantType type : kAllTypes) {
    SCOPED_TRACE(name_of(type));
    Owned o(type, n);
    const size_t before = MemTracker::get().current(MemCategory::workspace);
    BlockQuantizer q(o.t);
    EXPECT_EQ(MemTracker::get().current(MemCategory::workspace) - before,
              BlockQuantizer::absmax_bytes(type, n));
    EXPECT_THROW(q.add(x.data() + 64, 64, 64), RankError);  // elements 0.. come first
    q.add(x.data(), 0, 128);
    EXPECT_THROW(q.add(x.data() + 130, 130, 64), RankError);  // elements 128, 129 skipped
    EXPECT_THROW(q.add(x.data() + 128, 128, n), RankError);   // past the end
    EXPECT_THROW(q.finish(), RankError);                     // elements missing
    q.add(x.data() + 128, 128, n - 128);
    q.finish();
    // A range that ends inside a block: the next cannot start there (its
    // block's absmax would miss the first part).
    Owned o2(type, n);
    BlockQuantizer q2(o2.t);
    q2.add(x.data(), 0, 100);
    if (type == QuantType::f32)
      EXPECT_NO_THROW(q2.add(x.data() + 100, 100, n - 100));
    else
      EXPECT_THROW(q2.add(x.data() + 100, 100, n - 100), RankError);
  }
}

// ---- the tensor-parallel slice -----------------------------------------------------

TEST(QSlice, MatchesShardFromFull) {
  struct Split {
    int dim, parts;
  };
  const Split splits[] = {{-1, 1}, {0, 1}, {0, 3}, {1, 1}, {1, 2}};
  // (72, 40): rows that are not whole blocks; (48, 128): rows of two blocks.
  const int64_t shapes[][2] = {{72, 40}, {48, 128}};
  for (QuantType type : kAllTypes) {
    for (auto [R, K] : shapes) {
      const auto x = randn(R * K, 41 + R);
      Owned q(type, R * K);
      const auto full = roundtrip(q, x);
      for (const Split& s : splits) {
        for (int tp : {1, 2, 4}) {
          for (int rank = 0; rank < tp; ++rank) {
            SCOPED_TRACE(std::string(name_of(type)) + " (" + std::to_string(R) + ", " +
                         std::to_string(K) + ") dim " + std::to_string(s.dim) + " parts " +
                         std::to_string(s.parts) + " tp " + std::to_string(rank) + "/" +
                         std::to_string(tp));
            ParamSpec spec;
            spec.name = "w";
            spec.full_shape = Shape{R, K};
            spec.shape = spec.full_shape;
            spec.tp_dim = s.dim;
            spec.tp_parts = s.parts;
            if (s.dim >= 0) spec.shape.dims[s.dim] /= tp;
            std::vector<float> expect(spec.numel());
            shard_from_full(spec, full.data(), expect.data(), rank, tp);

            const QSlice w = make_qslice(q.t, R, K, s.dim, s.parts, rank, tp);
            ASSERT_EQ(w.local_rows(), spec.shape[0]);
            ASSERT_EQ(w.local_cols(), spec.shape[1]);
            std::vector<float> got(expect.size());
            dequantize_rows(w, 0, w.local_rows(), got.data());
            ASSERT_TRUE(same_bits(got, expect));
            // A run of rows from the middle.
            const int64_t i0 = w.local_rows() / 3, nr = w.local_rows() / 2;
            std::vector<float> mid(nr * w.local_cols());
            dequantize_rows(w, i0, nr, mid.data());
            ASSERT_EQ(std::memcmp(mid.data(), expect.data() + i0 * w.local_cols(),
                                  mid.size() * sizeof(float)),
                      0);
          }
        }
      }
    }
  }
}

TEST(QLayout, QarrayDataFindsEachArrayWhereQtensorAtPutIt) {
  for (QuantType type : kAllTypes) {
    SCOPED_TRACE(name_of(type));
    const QLayout L = qlayout(type, 1000);
    std::vector<uint8_t> mem(L.total_bytes);
    const QTensor t = qtensor_at(L, mem.data());
    for (int a = 0; a < L.narrays; ++a)
      EXPECT_EQ(qarray_data(t, L.arrays[a].name), mem.data() + L.arrays[a].offset)
          << L.arrays[a].name;
    EXPECT_EQ(qarray_data(t, "no such array"), nullptr);
  }
}

TEST(Dequantizer, LookupGivesTheRowsItHoldsAndZerosElsewhere) {
  // A vocabulary split over 2 ranks (rows): rank 1 holds logical rows
  // [24, 48); ids outside them (either side) give zero rows.
  for (QuantType type : kAllTypes) {
    SCOPED_TRACE(name_of(type));
    const int64_t R = 48, K = 40;
    Owned q(type, R * K);
    quantize_ref(randn(R * K, 71).data(), q.t);
    const QSlice w = make_qslice(q.t, R, K, 0, 1, 1, 2);
    std::vector<float> all(static_cast<size_t>(w.local_rows() * K));
    dequantize_rows(w, 0, w.local_rows(), all.data());
    const std::vector<int32_t> ids = {24, 0, 47, 23, 30, 48, 24};
    std::vector<float> got(ids.size() * K, std::numeric_limits<float>::quiet_NaN());
    Dequantizer::cpu().lookup(got.data(), ids.data(), static_cast<int>(ids.size()), w, 24);
    for (size_t r = 0; r < ids.size(); ++r) {
      const int64_t i = ids[r] - 24;
      for (int64_t c = 0; c < K; ++c) {
        const float want = (i >= 0 && i < w.local_rows()) ? all[i * K + c] : 0.0f;
        ASSERT_EQ(got[r * K + c], want) << "id " << ids[r] << " column " << c;
      }
    }
  }
}

// At bf16 and fp16 a quantized layer multiplies like any other: both inputs
// of each tile's GEMM, the dequantized tile included, rounded to 16 bits,
// products summed in fp32. Reference: the rounded operands multiplied in
// double; the fp32 sums of the tiles stay within a few float ulps of it.
TEST(QLinear, At16BitsRoundsTheDequantizedTileAndTheInput) {
  const int64_t R = 150, K = 72;  // 3 tiles, the last one partial
  const int N = 19;
  for (ops::Precision p : {ops::Precision::bf16, ops::Precision::fp16}) {
    SCOPED_TRACE(name_of(p));
    Owned q(QuantType::nf4, R * K);
    quantize_ref(randn(R * K, 81).data(), q.t);
    const QSlice w = make_qslice(q.t, R, K, -1, 1, 0, 1);
    std::vector<float> W(R * K);
    dequantize_rows(w, 0, R, W.data());
    const auto inp = randn(static_cast<size_t>(N) * K, 82);
    const auto bias = randn(R, 83);
    std::vector<float> ws(qlinear_workspace_floats(w));
    std::vector<float> out(static_cast<size_t>(N) * R);
    qlinear_forward(ops::Kernels::cpu(p), Dequantizer::cpu(), out.data(), inp.data(), w,
                    bias.data(), N, ws.data());
    const auto dout = randn(static_cast<size_t>(N) * R, 84);
    std::vector<float> dinp(static_cast<size_t>(N) * K, 0.0f);
    qlinear_backward_input(ops::Kernels::cpu(p), Dequantizer::cpu(), dinp.data(), dout.data(), w,
                           N, ws.data());
    double worst = 0, worst_fp32 = 0;
    for (int n = 0; n < N; ++n)
      for (int64_t o = 0; o < R; ++o) {
        double ref = 0, ref32 = 0, mag = 0;
        for (int64_t c = 0; c < K; ++c) {
          const double a = inp[n * K + c], b = W[o * K + c];
          ref += double(ops::round_to(p, float(a))) * ops::round_to(p, float(b));
          ref32 += a * b;
          mag += std::fabs(a * b);
        }
        const double got = out[n * R + o] - double(bias[o]);
        worst = std::max(worst, std::fabs(got - ref) / mag);
        worst_fp32 = std::max(worst_fp32, std::fabs(got - ref32) / mag);
      }
    EXPECT_LE(worst, 1e-6) << "forward against the rounded product";
    // ...and visibly not the fp32 product: the test would catch no rounding.
    EXPECT_GE(worst_fp32, 1e-4) << "forward equals the unrounded product";
    worst = 0;
    for (int n = 0; n < N; ++n)
      for (int64_t c = 0; c < K; ++c) {
        double ref = 0, mag = 0;
        for (int64_t o = 0; o < R; ++o) {
          const double a = dout[n * R + o], b = W[o * K + c];
          ref += double(ops::round_to(p, float(a))) * ops::round_to(p, float(b));
          mag += std::fabs(a * b);
        }
        worst = std::max(worst, std::fabs(dinp[n * K + c] - ref) / mag);
      }
    EXPECT_LE(worst, 1e-6) << "backward against the rounded product";
  }
}

TEST(QSlice, RejectsUnevenSplits) {
  Owned q(QuantType::nf4, 72 * 40);
  EXPECT_THROW(make_qslice(q.t, 72, 41, 0, 1, 0, 1), RankError);   // wrong element count
  EXPECT_THROW(make_qslice(q.t, 72, 40, 0, 3, 0, 5), RankError);   // 72 rows over 3 * 5
  EXPECT_THROW(make_qslice(q.t, 72, 40, 1, 1, 0, 3), RankError);   // 40 columns over 3
  EXPECT_THROW(make_qslice(q.t, 72, 40, 0, 1, 2, 2), RankError);   // rank out of range
  EXPECT_THROW(make_qslice(q.t, 72, 40, 2, 1, 0, 1), RankError);   // no dimension 2
  EXPECT_NO_THROW(make_qslice(q.t, 72, 40, 0, 3, 1, 4));
}

// ---- the quantized linear layer --------------------------------------------------

TEST(QLinear, MatchesMatmulOnTheDequantizedMatrix) {
  struct Case {
    int64_t R, K;
    int dim, parts, rank, tp;
  };
  // Local rows 78 and 150 (not multiples of the tile), 9 (less than one tile),
  // 128 (exactly two); columns 72, 68, 40 (not whole blocks), 128.
  const Case cases[] = {{156, 72, 0, 3, 1, 2},
                        {150, 136, 1, 1, 1, 2},
                        {36, 40, 0, 1, 3, 4},
                        {128, 128, -1, 1, 0, 1},
                        {150, 136, 1, 2, 0, 2}};
  const int N = 37;
  const ops::Kernels& cpu = ops::Kernels::cpu();
  const Dequantizer& dq = Dequantizer::cpu();
  for (QuantType type : kAllTypes) {
    for (const Case& c : cases) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(std::string(name_of(type)) + " (" + std::to_string(c.R) + ", " +
                     std::to_string(c.K) + ") dim " + std::to_string(c.dim) +
                     (with_bias ? " bias" : " no bias"));
        Owned q(type, c.R * c.K);
        quantize_ref(randn(c.R * c.K, 51 + c.R).data(), q.t);
        const QSlice w = make_qslice(q.t, c.R, c.K, c.dim, c.parts, c.rank, c.tp);
        const int OC = static_cast<int>(w.local_rows()), IC = static_cast<int>(w.local_cols());
        std::vector<float> W(static_cast<size_t>(OC) * IC);
        dequantize_rows(w, 0, OC, W.data());
        const auto inp = randn(static_cast<size_t>(N) * IC, 61);
        const auto bias = randn(OC, 62);
        const float* b = with_bias ? bias.data() : nullptr;
        // The CPU's tiles, and a GPU's size (more rows than some matrices have).
        for (int tile : {kQLinearTileRows, 100}) {
          std::vector<float> ws(qlinear_workspace_floats(w, tile));

          std::vector<float> ref(static_cast<size_t>(N) * OC);
          ops::matmul_forward(ref.data(), inp.data(), W.data(), b, N, IC, OC);
          std::vector<float> out(ref.size(), std::numeric_limits<float>::quiet_NaN());
          qlinear_forward(cpu, dq, out.data(), inp.data(), w, b, N, ws.data(), tile);
          double scale = 0, err = 0;
          for (size_t i = 0; i < ref.size(); ++i) {
            scale = std::max(scale, std::fabs(double(ref[i])));
            err = std::max(err, std::fabs(double(out[i]) - ref[i]));
          }
          EXPECT_LE(err, kQLinearTol * scale) << "forward, tiles of " << tile;

          const auto dout = randn(static_cast<size_t>(N) * OC, 63);
          // dinp is overwritten (as ops::matmul_backward's): it starts as NaN.
          std::vector<float> dref(static_cast<size_t>(N) * IC, std::numeric_limits<float>::quiet_NaN());
          std::vector<float> dgot = dref;
          ops::matmul_backward<float>(dref.data(), nullptr, nullptr, dout.data(), inp.data(),
                                      W.data(), N, IC, OC);
          qlinear_backward_input(cpu, dq, dgot.data(), dout.data(), w, N, ws.data(), tile);
          scale = err = 0;
          for (size_t i = 0; i < dref.size(); ++i) {
            scale = std::max(scale, std::fabs(double(dref[i])));
            err = std::max(err, std::fabs(double(dgot[i]) - dref[i]));
          }
          EXPECT_LE(err, kQLinearTol * scale) << "backward, tiles of " << tile;
        }
      }
    }
  }
}

// A LoRA adapter merged into the tiles (quant::QAdapter) gives the base's
// product plus the adapter's, x (W + s B A)^T + b forward and dout (W + s B A)
// backward, checked against that sum formed in double; with tiles smaller
// than the matrix, of several tiles, and holding every row (the one-GEMM path).
TEST(QLinear, MergedAdapterGivesBasePlusAdapterInDouble) {
  struct Case {
    int64_t R, K;
    int dim, parts, rank, tp;
  };
  const Case cases[] = {{156, 72, 0, 3, 1, 2}, {150, 136, 1, 1, 1, 2}, {128, 128, -1, 1, 0, 1}};
  const int N = 29, r = 5;
  const float s = 0.75f;
  const ops::Kernels& cpu = ops::Kernels::cpu();
  const Dequantizer& dq = Dequantizer::cpu();
  for (const Case& c : cases) {
    SCOPED_TRACE("(" + std::to_string(c.R) + ", " + std::to_string(c.K) + ") dim " +
                 std::to_string(c.dim));
    Owned q(QuantType::nf4, c.R * c.K);
    quantize_ref(randn(c.R * c.K, 71 + c.R).data(), q.t);
    const QSlice w = make_qslice(q.t, c.R, c.K, c.dim, c.parts, c.rank, c.tp);
    const int OC = static_cast<int>(w.local_rows()), IC = static_cast<int>(w.local_cols());
    std::vector<float> W(static_cast<size_t>(OC) * IC);
    dequantize_rows(w, 0, OC, W.data());
    const auto A = randn(static_cast<size_t>(r) * IC, 72), B = randn(static_cast<size_t>(OC) * r, 73);
    const auto inp = randn(static_cast<size_t>(N) * IC, 74), bias = randn(OC, 75);
    const auto dout = randn(static_cast<size_t>(N) * OC, 76);
    // W + s B A, then both products, in double.
    std::vector<double> Weff(W.size());
    for (int o = 0; o < OC; ++o)
      for (int i = 0; i < IC; ++i) {
        double acc = 0;
        for (int j = 0; j < r; ++j) acc += double(B[size_t(o) * r + j]) * A[size_t(j) * IC + i];
        Weff[size_t(o) * IC + i] = W[size_t(o) * IC + i] + double(s) * acc;
      }
    std::vector<double> ref(static_cast<size_t>(N) * OC), dref(static_cast<size_t>(N) * IC);
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) {
        double acc = bias[o];
        for (int i = 0; i < IC; ++i) acc += double(inp[size_t(n) * IC + i]) * Weff[size_t(o) * IC + i];
        ref[size_t(n) * OC + o] = acc;
        for (int i = 0; i < IC; ++i)
          dref[size_t(n) * IC + i] += double(dout[size_t(n) * OC + o]) * Weff[size_t(o) * IC + i];
      }
    QAdapter lora;
    lora.A = A.data();
    lora.B = B.data();
    lora.scale = s;
    lora.rank = r;
    for (int tile : {kQLinearTileRows, 7, OC}) {
      std::vector<float> ws(qlinear_workspace_floats(w, tile));
      std::vector<float> out(ref.size(), std::numeric_limits<float>::quiet_NaN());
      qlinear_forward(cpu, dq, out.data(), inp.data(), w, bias.data(), N, ws.data(), tile, &lora);
      std::vector<float> dgot(dref.size(), std::numeric_limits<float>::quiet_NaN());  // overwritten
      qlinear_backward_input(cpu, dq, dgot.data(), dout.data(), w, N, ws.data(), tile, &lora);
      for (const auto& [got, want, what] :
           {std::tuple{&out, &ref, "forward"}, std::tuple{&dgot, &dref, "backward"}}) {
        double scale = 0, err = 0;
        for (size_t i = 0; i < want->size(); ++i) {
          scale = std::max(scale, std::fabs((*want)[i]));
          err = std::max(err, std::fabs(double((*got)[i]) - (*want)[i]));
        }
        EXPECT_LE(err, 1e-5 * scale) << what << ", tiles of " << tile;
      }
    }
    // Without the adapter the same call is the base alone: the adapter's part
    // is large enough to be seen.
    std::vector<float> ws(qlinear_workspace_floats(w, OC)), plain(ref.size());
    qlinear_forward(cpu, dq, plain.data(), inp.data(), w, bias.data(), N, ws.data(), OC);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      diff = std::max(diff, std::fabs(double(plain[i]) - ref[i]));
      scale = std::max(scale, std::fabs(ref[i]));
    }
    EXPECT_GT(diff, 1e-2 * scale);
  }
}
