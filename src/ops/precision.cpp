// Rounding to the GEMM input formats of train.precision on the CPU.
#include "ops/precision.h"

#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/blas.h"

namespace meshlm::ops {

float round_to_fp16(float x) {
  // By hand rather than through a compiler's half type (not every compiler
  // has one on x86): the IEEE rounding, to nearest, ties to even.
  const uint32_t u = std::bit_cast<uint32_t>(x), sign = u & 0x80000000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return x;  // NaN
  if (a >= 0x477ff000u)            // |x| >= 65520: rounds past 65504
    return std::bit_cast<float>(sign | 0x7f800000u);
  if (a < 0x38800000u) {  // below 2^-14: half's subnormals, multiples of 2^-24
    const float q = std::nearbyint(std::ldexp(std::fabs(x), 24));  // ties to even
    return std::copysign(std::ldexp(q, -24), x);
  }
  a += 0xfffu + ((a >> 13) & 1u);  // keep 10 of float's 23 mantissa bits
  return std::bit_cast<float>(sign | (a & ~0x1fffu));
}

void round_matrix(Precision p, float* dst, const float* src, size_t rows, size_t cols, size_t ld) {
  const long long R = static_cast<long long>(rows);
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && rows * cols > (1u << 16))
  for (long long r = 0; r < R; ++r) {
    const float* s = src + static_cast<size_t>(r) * ld;
    float* d = dst + static_cast<size_t>(r) * cols;
    switch (p) {
      case Precision::bf16:
        for (size_t c = 0; c < cols; ++c) d[c] = round_to_bf16(s[c]);
        break;
      case Precision::fp16:
        for (size_t c = 0; c < cols; ++c) d[c] = round_to_fp16(s[c]);
        break;
      case Precision::fp32:
        for (size_t c = 0; c < cols; ++c) d[c] = s[c];
        break;
    }
  }
}

void gemm(Precision p, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (p == Precision::fp32 || M == 0 || N == 0 || K == 0) {
    gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // op(A) is (M,K): stored (K,M) when transposed; op(B) is (K,N): stored (N,K).
  const size_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  thread_local std::vector<float> a, b;
  a.resize(ar * ac);
  b.resize(br * bc);
  round_matrix(p, a.data(), A, ar, ac, static_cast<size_t>(lda));
  round_matrix(p, b.data(), B, br, bc, static_cast<size_t>(ldb));
  gemm(ta, tb, M, N, K, alpha, a.data(), static_cast<int>(ac), b.data(), static_cast<int>(bc), beta,
       C, ldc);
}

}  // namespace meshlm::ops
