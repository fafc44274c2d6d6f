// train.precision on the CPU: rounding to bf16 and fp16 against values fixed
// by the IEEE formats (written out by hand, not computed by the code under
// test), the rounding GEMM against a double-precision product of rounded
// inputs, the ops at bf16 against fp32, and the fp16 loss scaler. The whole
// model at bf16 is checked against PyTorch by tests/torch/check_gpt2_grads.py
// --precision bf16.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "core/alloc.h"
#include "core/rng.h"
#include "ops/blas.h"
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

namespace {

// A rounded GEMM under test: C(M,N) = alpha op(A) op(B) + beta C at `p`.
using RoundedGemm = std::function<void(bool ta, bool tb, int M, int N, int K, float alpha,
                                       const float* A, int lda, const float* B, int ldb,
                                       float beta, float* C, int ldc)>;

// `gemm` at bf16/fp16 = the exact product of the rounded inputs, up to fp32
// accumulation, in every transpose, with leading dimensions wider than the
// matrices; and not the fp32 product. The reference: the inputs rounded by
// round_to (checked above against values written out by hand), multiplied
// in double.
void expect_rounded_product(Precision p, int M, int N, int K, const RoundedGemm& gemm, Rng& rng) {
  SCOPED_TRACE(testing::Message() << name_of(p) << " " << M << "x" << N << "x" << K);
  const int pad = 3;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE(testing::Message() << "ta " << ta << " tb " << tb);
      const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
      const int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
      std::vector<float> A(size_t(ar) * lda), B(size_t(br) * ldb), C(size_t(M) * ldc, 0.5f);
      for (float& x : A) x = static_cast<float>(2 * rng.uniform() - 1);
      for (float& x : B) x = static_cast<float>(2 * rng.uniform() - 1);
      std::vector<float> C32 = C;
      gemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), ldc);
      ops::Kernels::cpu().gemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, 2.0f,
                               C32.data(), ldc);
      // In double: the product of the rounded inputs and of their
      // magnitudes (what bounds the fp32 sums' error).
      std::vector<double> Ar(A.size()), Br(B.size()), Aa(A.size()), Ba(B.size());
      for (size_t e = 0; e < A.size(); ++e) Aa[e] = std::fabs(Ar[e] = ops::round_to(p, A[e]));
      for (size_t e = 0; e < B.size(); ++e) Ba[e] = std::fabs(Br[e] = ops::round_to(p, B[e]));
      std::vector<double> want(size_t(M) * N), magnitude(want.size());
      ops::gemm(ta, tb, M, N, K, 1.0, Ar.data(), lda, Br.data(), ldb, 0.0, want.data(), N);
      ops::gemm(ta, tb, M, N, K, 1.0, Aa.data(), lda, Ba.data(), ldb, 0.0, magnitude.data(), N);
      double max_from_fp32 = 0, allowance = 0;
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          const size_t e = size_t(i) * N + j;
          const double w = 0.75 * want[e] + 2.0 * 0.5;
          // fp32 sums of K terms: off by a few 2^-24 of the terms' summed
          // magnitude (an input left unrounded is off by about 2^-9 of it
          // / sqrt(K) at bf16, 2^-12 / sqrt(K) at fp16: far more).
          const double fp32_sums =
              8 * std::ldexp(0.75 * magnitude[e], -24) + 1e-6 * (1 + std::fabs(w));
          allowance = std::max(allowance, fp32_sums);
          ASSERT_NEAR(C[size_t(i) * ldc + j], w, fp32_sums) << "at " << i << "," << j;
          max_from_fp32 = std::max(max_from_fp32, std::fabs(C32[size_t(i) * ldc + j] - w));
        }
      }
      // The inputs really were rounded: the fp32 product is further off
      // than fp32 accumulation could explain.
      EXPECT_GT(max_from_fp32, 20 * allowance);
      // The padding between rows is untouched.
      for (int i = 0; i < M; ++i)
        for (int j = N; j < ldc; ++j) EXPECT_EQ(C[size_t(i) * ldc + j], 0.5f);
    }
  }
}

}  // namespace

// The backend's GEMM (Kernels::gemm at bf16 and fp16): a small shape, and
// one of several stretches of K and blocks of rows (round_tiles), with and
// without a RoundingScratch.
TEST(Precision, GemmRoundsBothInputs) {
  Rng rng(7);
  const int Kx = ops::kRoundMaxK + 6;
  const ops::RoundTiles t = ops::round_tiles(4200, 3, Kx);
  EXPECT_TRUE(t.kb == ops::kRoundMaxK && t.mb < 4200 && t.nb == 3);
  for (const bool scratch : {false, true}) {
    std::optional<ops::RoundingScratch> rounding;
    if (scratch) rounding.emplace(2);
    SCOPED_TRACE(testing::Message() << "scratch " << scratch);
    for (const Precision p : {Precision::bf16, Precision::fp16}) {
      const ops::Kernels& k = ops::Kernels::cpu(p);
      ASSERT_EQ(k.precision(), p);
      const RoundedGemm gemm = [&k](bool ta, bool tb, int M, int N, int K, float alpha,
                                    const float* A, int lda, const float* B, int ldb, float beta,
                                    float* C, int ldc) {
        k.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      };
      expect_rounded_product(p, 5, 7, 33, gemm, rng);
      if (scratch != (p == Precision::fp16)) expect_rounded_product(p, 4200, 3, Kx, gemm, rng);
    }
  }
}

// Every path of the tiled GEMM on small tiles: several stretches of K,
// blocks of rows and of columns with edges, either operand outside.
TEST(Precision, GemmTilesTakeEveryPath) {
  Rng rng(9);
  for (const bool rows_outer : {true, false}) {
    for (const Precision p : {Precision::bf16, Precision::fp16}) {
      const ops::RoundTiles t{7, 5, 16, rows_outer};
      std::vector<float> scratch((size_t(t.mb) + t.nb) * t.kb);
      SCOPED_TRACE(testing::Message() << "rows outer " << rows_outer);
      expect_rounded_product(p, 23, 19, 41,
                             [&](bool ta, bool tb, int M, int N, int K, float alpha,
                                 const float* A, int lda, const float* B, int ldb, float beta,
                                 float* C, int ldc) {
                               ops::gemm_tiles(p, t, scratch.data(), ta, tb, M, N, K, alpha, A,
                                               lda, B, ldb, beta, C, ldc);
                             },
                             rng);
    }
  }
}

// round_tiles: the stretch of K at most kRoundMaxK; blocks that fit the
// scratch; all of an operand when it fits beside the other's block; the
// order that rounds fewer elements.
TEST(Precision, RoundTilesFitTheScratch) {
  const int Kx = ops::kRoundMaxK + 6;
  const ops::RoundTiles small = ops::round_tiles(5, 7, 33), rows = ops::round_tiles(4200, 3, Kx),
                        cols = ops::round_tiles(3, 4200, Kx), wide = ops::round_tiles(2100, 3000, Kx),
                        tall = ops::round_tiles(3000, 2100, Kx),
                        logits = ops::round_tiles(256, 50304, 768);
  EXPECT_TRUE(small.mb == 5 && small.nb == 7 && small.kb == 33);
  EXPECT_TRUE(rows.kb == ops::kRoundMaxK && rows.nb == 3 && rows.mb < 4200 && !rows.rows_outer);
  EXPECT_TRUE(cols.mb == 3 && cols.nb < 4200 && cols.rows_outer);
  EXPECT_TRUE(wide.mb < 2100 && wide.nb < 3000 && !wide.rows_outer);
  EXPECT_TRUE(tall.mb < 3000 && tall.nb < 2100 && tall.rows_outer);
  // The classifier's logits: its rows whole and rounded once, wte's rows
  // (op(B)'s columns) in blocks.
  EXPECT_TRUE(logits.mb == 256 && logits.kb == 768 && logits.nb < 50304 && logits.rows_outer);
  for (const ops::RoundTiles t : {small, rows, cols, wide, tall, logits})
    EXPECT_LE((size_t(t.mb) + t.nb) * t.kb, ops::kRoundingScratchFloats);
}

// The rounded GEMMs' scratch is one tracked workspace Buffer of
// rounding_scratch_bytes(threads) while a RoundingScratch lives, and nothing
// after; a GEMM gives the same bits through it as through its own block,
// on the main thread and on every thread of a parallel region (each its
// own part of the scratch: the threads' products must not mix).
TEST(Precision, RoundingScratchIsTrackedAndChangesNoBits) {
  MemTracker& t = MemTracker::get();
  const size_t before = t.current(MemCategory::workspace);
  // Blocks of rows and stretches of K (round_tiles), in each thread.
  const int M = 5000, N = 40, K = ops::kRoundMaxK + 5, threads = 3;
  Rng rng(5);
  std::vector<float> A(size_t(M) * K), B(size_t(K) * N);
  for (float& x : A) x = static_cast<float>(rng.normal());
  for (float& x : B) x = static_cast<float>(rng.normal());
  const ops::Kernels& k = ops::Kernels::cpu(Precision::bf16);
  // Each thread of a region computes its own column block's product, from
  // its own part of the scratch, a whole tile's worth at once.
  const auto product = [&](std::vector<float>& C, bool in_region) {
    C.assign(size_t(M) * N, 0.0f);
    if (!in_region) {
      k.gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
      return;
    }
    const int cols = N / threads;
#pragma omp parallel num_threads(threads)
    {
      const int c0 = omp_get_thread_num() * cols;
      const int n = omp_get_thread_num() == threads - 1 ? N - c0 : cols;
      k.gemm(false, false, M, n, K, 1.0f, A.data(), K, B.data() + c0, N, 0.0f, C.data() + c0, N);
    }
  };
  std::vector<float> own, own_region, shared, shared_region;
  product(own, false);
  product(own_region, true);
  {
    const ops::RoundingScratch scratch(threads);
    EXPECT_EQ(t.current(MemCategory::workspace) - before, ops::rounding_scratch_bytes(threads));
    EXPECT_EQ(ops::rounding_scratch_bytes(threads), size_t(threads) * (16 << 20));
    product(shared, false);
    product(shared_region, true);
  }
  EXPECT_EQ(t.current(MemCategory::workspace), before);
  EXPECT_EQ(ops::rounding_scratch_bytes(0), 0u);
  for (size_t i = 0; i < own.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(shared[i]), std::bit_cast<uint32_t>(own[i])) << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(shared_region[i]), std::bit_cast<uint32_t>(own_region[i]))
        << i;
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
