// train.precision on the CPU: rounding to bf16 and fp16 against values fixed
// by the IEEE formats (written out by hand, not computed by the code under
// test), the rounding GEMM against a double-precision product of rounded
// inputs, the ops at bf16 against fp32, and the fp16 loss scaler. The whole
// model at bf16 is checked against PyTorch by tests/torch/check_gpt2_grads.py
// --precision bf16.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "ops/kernels.h"
#include "ops/precision.h"
#include "train/loss_scaler.h"

using namespace meshlm;
using ops::Precision;

namespace {
float pow2(int e) { return std::ldexp(1.0f, e); }
const float kInf = std::numeric_limits<float>::infinity();
}  // namespace

TEST(Precision, Bf16RoundsToNearestEven) {
  // bf16 keeps 7 mantissa bits: at 1 its spacing is 2^-7.
  EXPECT_EQ(ops::round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(ops::round_to_bf16(1.0f + pow2(-7)), 1.0f + pow2(-7));         // representable
  EXPECT_EQ(ops::round_to_bf16(1.0f + pow2(-8)), 1.0f);                    // tie -> even (down)
  EXPECT_EQ(ops::round_to_bf16(1.0f + 3 * pow2(-8)), 1.0f + pow2(-6));     // tie -> even (up)
  EXPECT_EQ(ops::round_to_bf16(1.0f + pow2(-8) + pow2(-20)), 1.0f + pow2(-7));  // above the tie
  EXPECT_EQ(ops::round_to_bf16(-(1.0f + pow2(-8) + pow2(-20))), -(1.0f + pow2(-7)));
  EXPECT_EQ(ops::round_to_bf16(3.14159265f), 3.140625f);  // 0x4049
  EXPECT_EQ(ops::round_to_bf16(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(ops::round_to_bf16(-0.0f)));
  // The largest float rounds past bf16's largest (0x7f7f) to infinity.
  EXPECT_EQ(ops::round_to_bf16(std::numeric_limits<float>::max()), kInf);
  EXPECT_EQ(ops::round_to_bf16(-kInf), -kInf);
  EXPECT_TRUE(std::isnan(ops::round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  // Subnormal floats keep bf16's exponent range: 2^-130 is exact.
  EXPECT_EQ(ops::round_to_bf16(pow2(-130)), pow2(-130));
}

TEST(Precision, Fp16RoundsToNearestEvenAndOverflows) {
  // fp16 keeps 10 mantissa bits: at 1 its spacing is 2^-10.
  EXPECT_EQ(ops::round_to_fp16(1.0f + pow2(-11)), 1.0f);                 // tie -> even
  EXPECT_EQ(ops::round_to_fp16(1.0f + 3 * pow2(-11)), 1.0f + pow2(-9));  // tie -> even
  EXPECT_EQ(ops::round_to_fp16(65504.0f), 65504.0f);  // the largest half
  EXPECT_EQ(ops::round_to_fp16(65519.0f), 65504.0f);  // below the midpoint to 65536
  EXPECT_EQ(ops::round_to_fp16(65520.0f), kInf);      // the midpoint: ties to "even" infinity
  EXPECT_EQ(ops::round_to_fp16(-1e6f), -kInf);
  EXPECT_EQ(ops::round_to_fp16(pow2(-24)), pow2(-24));  // the smallest subnormal
  EXPECT_EQ(ops::round_to_fp16(pow2(-25)), 0.0f);       // half of it: tie -> even (0)
  EXPECT_EQ(ops::round_to_fp16(1.5f * pow2(-24)), pow2(-23));  // tie -> even (2 x 2^-24)
  EXPECT_EQ(ops::round_to_fp16(pow2(-26)), 0.0f);
  EXPECT_EQ(ops::round_to(Precision::fp32, 1.0f + pow2(-20)), 1.0f + pow2(-20));
}

// gemm at bf16/fp16 = the exact product of the rounded inputs, up to fp32
// accumulation, in every transpose, with leading dimensions wider than the
// matrices; and not the fp32 product.
TEST(Precision, GemmRoundsBothInputs) {
  Rng rng(7);
  const int M = 5, N = 7, K = 33, pad = 3;
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
        const int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
        std::vector<float> A(size_t(ar) * lda), B(size_t(br) * ldb), C(size_t(M) * ldc, 0.5f);
        for (float& x : A) x = static_cast<float>(rng.normal());
        for (float& x : B) x = static_cast<float>(rng.normal());
        std::vector<float> C32 = C;
        const ops::Kernels& k = ops::Kernels::cpu(p);
        ASSERT_EQ(k.precision(), p);
        k.gemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), ldc);
        ops::Kernels::cpu().gemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, 2.0f,
                                 C32.data(), ldc);
        double max_from_fp32 = 0;
        for (int i = 0; i < M; ++i) {
          for (int j = 0; j < N; ++j) {
            double acc = 0;
            for (int kk = 0; kk < K; ++kk) {
              const float a = ta ? A[size_t(kk) * lda + i] : A[size_t(i) * lda + kk];
              const float b = tb ? B[size_t(j) * ldb + kk] : B[size_t(kk) * ldb + j];
              acc += double(ops::round_to(p, a)) * double(ops::round_to(p, b));
            }
            const double want = 0.75 * acc + 2.0 * 0.5;
            EXPECT_NEAR(C[size_t(i) * ldc + j], want, 1e-5 * (1 + std::fabs(want)))
                << "precision " << name_of(p) << " ta " << ta << " tb " << tb << " at " << i << ","
                << j;
            max_from_fp32 = std::max(max_from_fp32, std::fabs(C32[size_t(i) * ldc + j] - want));
          }
        }
        // The inputs really were rounded: the fp32 product is further off
        // than fp32 accumulation could explain.
        EXPECT_GT(max_from_fp32, 1e-3) << name_of(p) << " ta " << ta << " tb " << tb;
        // The padding between rows is untouched.
        for (int i = 0; i < M; ++i)
          for (int j = N; j < ldc; ++j) EXPECT_EQ(C[size_t(i) * ldc + j], 0.5f);
      }
    }
  }
}

namespace {
// max |a - b| / max |b|: how far a is from the reference b.
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - b[i]));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return num / den;
}
}  // namespace

// The linear layer and attention at bf16 stay within bf16's error of fp32
// but are not fp32.
TEST(Precision, OpsAtBf16AreCloseToFp32) {
  Rng rng(11);
  const int B = 2, T = 16, C = 32, NH = 4, N = B * T, OC = 48;
  std::vector<float> x(size_t(N) * C), w(size_t(OC) * C), bias(OC), qkv(size_t(N) * 3 * C);
  for (float& v : x) v = static_cast<float>(rng.normal());
  for (float& v : w) v = static_cast<float>(0.2 * rng.normal());
  for (float& v : bias) v = static_cast<float>(rng.normal());
  for (float& v : qkv) v = static_cast<float>(rng.normal());
  const ops::Kernels &f32 = ops::Kernels::cpu(), &b16 = ops::Kernels::cpu(Precision::bf16);
  std::vector<float> y32(size_t(N) * OC), y16(y32.size());
  f32.matmul_forward(y32.data(), x.data(), w.data(), bias.data(), N, C, OC);
  b16.matmul_forward(y16.data(), x.data(), w.data(), bias.data(), N, C, OC);
  EXPECT_LT(rel(y16, y32), 2e-2);
  EXPECT_GT(rel(y16, y32), 1e-4);
  std::vector<float> a32(size_t(N) * C), a16(a32.size()), att(size_t(B) * NH * T * T);
  f32.attention_forward(a32.data(), att.data(), qkv.data(), B, T, C, NH);
  b16.attention_forward(a16.data(), att.data(), qkv.data(), B, T, C, NH);
  EXPECT_LT(rel(a16, a32), 3e-2);
  EXPECT_GT(rel(a16, a32), 1e-4);
}

// Flash attention at bf16 and fp16 rounds the inputs of the same GEMMs as
// the probabilities' version (Q and K for the scores, the normalised P and V
// for the output, and in backward dY, V, P, dS, K and Q): the outputs agree to
// fp32 summation order, while both are visibly off the fp32 result.
TEST(Precision, FlashAttentionRoundsAsTheProbabilitiesDo) {
  Rng rng(12);
  const int B = 2, T = 70, C = 32, NH = 2, N = B * T;
  std::vector<float> qkv(size_t(N) * 3 * C), dy(size_t(N) * C);
  for (float& v : qkv) v = static_cast<float>(rng.normal());
  for (float& v : dy) v = static_cast<float>(rng.normal());
  struct Result {
    std::vector<float> y, dqkv;
  };
  auto run = [&](Precision p, bool flash) {
    const ops::Kernels& k = ops::Kernels::cpu(p);
    Result r{std::vector<float>(size_t(N) * C), std::vector<float>(qkv.size(), 0.0f)};
    if (flash) {
      std::vector<float> lse(size_t(B) * NH * T), delta(lse.size());
      k.flash_attention_forward(r.y.data(), lse.data(), qkv.data(), B, T, C, NH);
      k.flash_attention_backward(r.dqkv.data(), delta.data(), dy.data(), r.y.data(), qkv.data(),
                                 lse.data(), B, T, C, NH);
    } else {
      std::vector<float> att(size_t(B) * NH * T * T), datt(att.size());
      k.attention_forward(r.y.data(), att.data(), qkv.data(), B, T, C, NH);
      k.attention_backward(r.dqkv.data(), datt.data(), dy.data(), qkv.data(), att.data(), B, T, C,
                           NH);
    }
    return r;
  };
  const Result f32 = run(Precision::fp32, false);
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(name_of(p));
    const Result ref = run(p, false), flash = run(p, true);
    EXPECT_LT(rel(flash.y, ref.y), 1e-6);
    // The backward differs where D enters: sum_s P dP from rounded dY and V
    // there, dY . Y here; then dS is rounded. Measured: 2.4e-3 (bf16) and
    // 2.7e-4 (fp16) of the largest element.
    EXPECT_LT(rel(flash.dqkv, ref.dqkv), p == Precision::bf16 ? 1e-2 : 1.5e-3);
    EXPECT_GT(rel(flash.y, f32.y), 1e-4);
    EXPECT_LT(rel(flash.y, f32.y), 3e-2);
  }
}

TEST(LossScaler, HalvesOnOverflowDoublesAfterTheWindow) {
  LossScaler s(true, {.initial = 1024.0, .window = 3});
  EXPECT_EQ(s.scale(), 1024.0);
  s.overflowed();
  EXPECT_EQ(s.scale(), 512.0);
  s.applied();
  s.applied();
  EXPECT_EQ(s.scale(), 512.0);
  s.overflowed();  // breaks the run of good steps
  EXPECT_EQ(s.scale(), 256.0);
  s.applied();
  s.applied();
  EXPECT_EQ(s.scale(), 256.0);
  s.applied();
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.overflows(), 2);
  LossScaler top(true, {.initial = LossScaler::kMax, .window = 1});
  top.applied();
  EXPECT_EQ(top.scale(), LossScaler::kMax);
  LossScaler low(true, {.initial = 1.0, .window = 1});
  for (int i = 0; i < 24; ++i) low.overflowed();
  EXPECT_FALSE(low.exhausted());  // 2^-24
  low.overflowed();
  EXPECT_TRUE(low.exhausted());
  LossScaler off(false, {.initial = 1024.0, .window = 1});
  EXPECT_EQ(off.scale(), 1.0);
  off.applied();
  EXPECT_EQ(off.scale(), 1.0);
}

// Against the compiler's own half type where it has one (GCC on x86-64):
// every float of a sweep over the exponents of half's range and beyond.
#if defined(__FLT16_MAX__) && !defined(__clang__)
TEST(Precision, Fp16MatchesTheCompilersHalfType) {
  Rng rng(5);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng.below(0x48000000u)) ^
                          (static_cast<uint32_t>(rng.below(2)) << 31);  // |x| < 2^17
    const float x = std::bit_cast<float>(bits);
    const float want = static_cast<float>(static_cast<_Float16>(x));
    ASSERT_EQ(std::bit_cast<uint32_t>(ops::round_to_fp16(x)), std::bit_cast<uint32_t>(want))
        << "x = " << x << " (0x" << std::hex << bits << ")";
  }
}
#endif
