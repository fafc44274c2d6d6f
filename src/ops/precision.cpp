// Rounding to the GEMM input formats of train.precision on the CPU.
#include "ops/precision.h"

#include <omp.h>

#include <algorithm>
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

namespace {

// The registered scratch (RoundingScratch): set and cleared by the main
// thread outside parallel regions, read by the threads of later regions.
float* g_scratch = nullptr;
int g_scratch_threads = 0;

// The calling thread's part of the registered scratch, or null.
float* thread_scratch() {
  const int t = omp_in_parallel() ? omp_get_thread_num() : 0;
  if (g_scratch == nullptr || t >= g_scratch_threads) return nullptr;
  return g_scratch + static_cast<size_t>(t) * kRoundingScratchFloats;
}

}  // namespace

RoundingScratch::RoundingScratch(int threads)
    : threads_(std::max(threads, 1)),
      buf_(rounding_scratch_bytes(threads_), MemCategory::workspace, "rounded GEMM tiles") {
  g_scratch = buf_.as<float>();
  g_scratch_threads = threads_;
}

RoundingScratch::~RoundingScratch() {
  if (g_scratch == buf_.as<float>()) {
    g_scratch = nullptr;
    g_scratch_threads = 0;
  }
}

void gemm(Precision p, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (p == Precision::fp32 || M == 0 || N == 0 || K == 0) {
    gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // The tiles this call needs, in the thread's scratch or (none registered)
  // in a block of their size freed on return.
  const size_t mb = std::min(M, kRoundTileM), nb = std::min(N, kRoundTileN),
               kb = std::min(K, kRoundTileK);
  std::vector<float> own;
  float* a = thread_scratch();
  if (a == nullptr) {
    own.resize((mb + nb) * kb);
    a = own.data();
  }
  float* b = a + mb * kb;
  // op(A) is (M,K): stored (K,M) when transposed; op(B) is (K,N): stored (N,K).
  const auto at = [&](const float* X, int ld, bool t, int r0, int c0) {  // element (r0, c0) of op(X)
    return t ? X + static_cast<size_t>(c0) * ld + r0 : X + static_cast<size_t>(r0) * ld + c0;
  };
  for (int k0 = 0; k0 < K; k0 += kRoundTileK) {
    const int k = std::min(kRoundTileK, K - k0);
    const float beta_k = k0 == 0 ? beta : 1.0f;
    for (int n0 = 0; n0 < N; n0 += kRoundTileN) {
      const int n = std::min(kRoundTileN, N - n0);
      // op(B)'s rows k0.., columns n0..: stored as n x k when transposed.
      const int bc = tb ? k : n;
      round_matrix(p, b, at(B, ldb, tb, k0, n0), tb ? n : k, bc, static_cast<size_t>(ldb));
      for (int m0 = 0; m0 < M; m0 += kRoundTileM) {
        const int m = std::min(kRoundTileM, M - m0);
        const int ac = ta ? m : k;
        round_matrix(p, a, at(A, lda, ta, m0, k0), ta ? k : m, ac, static_cast<size_t>(lda));
        gemm(ta, tb, m, n, k, alpha, a, ac, b, bc, beta_k,
             C + static_cast<size_t>(m0) * ldc + n0, ldc);
      }
    }
  }
}

}  // namespace meshlm::ops
