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

RoundTiles round_tiles(int M, int N, int K) {
  RoundTiles t;
  t.kb = std::min(K, kRoundMaxK);
  const long long R = static_cast<long long>(kRoundingScratchFloats) / t.kb;  // mb + nb
  if (M + N <= R) {
    t.mb = M, t.nb = N;
  } else if (M <= R / 2) {
    t.mb = M, t.nb = static_cast<int>(R - M);
  } else if (N <= R / 2) {
    t.nb = N, t.mb = static_cast<int>(R - N);
  } else {
    t.mb = t.nb = static_cast<int>(R / 2);
  }
  // Elements rounded per stretch of K (times its length): the outer
  // operand once, the inner once per outer block.
  const double blocks_m = (M + t.mb - 1) / t.mb, blocks_n = (N + t.nb - 1) / t.nb;
  t.rows_outer = double(M) + double(N) * blocks_m <= double(N) + double(M) * blocks_n;
  return t;
}

void gemm_tiles(Precision p, const RoundTiles& t, float* scratch, bool ta, bool tb, int M, int N,
                int K, float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                float* C, int ldc) {
  float* a = scratch;
  float* b = a + static_cast<size_t>(t.mb) * t.kb;
  // op(A) is (M,K): stored (K,M) when transposed; op(B) is (K,N): stored (N,K).
  const auto at = [](const float* X, int ld, bool tr, int r0, int c0) {  // op(X)(r0, c0)
    return tr ? X + static_cast<size_t>(c0) * ld + r0 : X + static_cast<size_t>(r0) * ld + c0;
  };
  // Rows m0.. (m of them) of op(A) over the stretch k0.. (k), into a; its
  // leading dimension returned. Likewise columns n0.. of op(B) into b.
  const auto round_a = [&](int m0, int m, int k0, int k) {
    round_matrix(p, a, at(A, lda, ta, m0, k0), ta ? k : m, ta ? m : k, static_cast<size_t>(lda));
    return ta ? m : k;
  };
  const auto round_b = [&](int n0, int n, int k0, int k) {
    round_matrix(p, b, at(B, ldb, tb, k0, n0), tb ? n : k, tb ? k : n, static_cast<size_t>(ldb));
    return tb ? k : n;
  };
  for (int k0 = 0; k0 < K; k0 += t.kb) {
    const int k = std::min(t.kb, K - k0);
    const float beta_k = k0 == 0 ? beta : 1.0f;
    const auto product = [&](int m0, int m, int lda_t, int n0, int n, int ldb_t) {
      gemm(ta, tb, m, n, k, alpha, a, lda_t, b, ldb_t, beta_k,
           C + static_cast<size_t>(m0) * ldc + n0, ldc);
    };
    if (t.rows_outer) {
      for (int m0 = 0; m0 < M; m0 += t.mb) {
        const int m = std::min(t.mb, M - m0), lda_t = round_a(m0, m, k0, k);
        for (int n0 = 0; n0 < N; n0 += t.nb) {
          const int n = std::min(t.nb, N - n0);
          product(m0, m, lda_t, n0, n, round_b(n0, n, k0, k));
        }
      }
    } else {
      for (int n0 = 0; n0 < N; n0 += t.nb) {
        const int n = std::min(t.nb, N - n0), ldb_t = round_b(n0, n, k0, k);
        for (int m0 = 0; m0 < M; m0 += t.mb) {
          const int m = std::min(t.mb, M - m0);
          product(m0, m, round_a(m0, m, k0, k), n0, n, ldb_t);
        }
      }
    }
  }
}

void gemm(Precision p, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (p == Precision::fp32 || M == 0 || N == 0 || K == 0) {
    gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const RoundTiles t = round_tiles(M, N, K);
  // The tiles in the thread's scratch or (none registered) in a block of
  // their size, freed on return.
  std::vector<float> own;
  float* scratch = thread_scratch();
  if (scratch == nullptr) {
    own.resize((static_cast<size_t>(t.mb) + t.nb) * t.kb);
    scratch = own.data();
  }
  gemm_tiles(p, t, scratch, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace meshlm::ops
