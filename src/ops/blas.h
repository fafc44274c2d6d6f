// Row-major GEMM on the CPU through CBLAS (OpenBLAS, OpenMP flavour), one
// spelling for float and double so the ops can be templates; and the thread
// count both use.
//   C(M,N) = alpha * op(A) op(B) + beta * C, op = transpose when ta/tb.
#pragma once

#include <cblas.h>
#include <algorithm>
#include <omp.h>

#include "ops/precision.h"

namespace meshlm::ops {

// The threads of this rank's own OpenMP loops and of OpenBLAS: one pool, as
// both are OpenMP (the OpenMP flavour of OpenBLAS; see CMakeLists.txt).
inline void set_threads(int n) {
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

// OpenBLAS packs a panel of op(A)'s rows (all M of them, times up to GEMM_Q
// of K: 320 on Haswell) into its per-thread buffer, whose pages stay
// resident: a GEMM of M = 50304 (the classifier's weight gradient) leaves
// 60 MiB of them. gemm() hands it at most kGemmRows rows at a time (the
// same arithmetic per element of C), so that this buffer stays below
// kGemmRows * 320 * 4 bytes, ~1.3 MiB, whatever the shapes (repacking the
// other operand once per 1024 rows costs 1/1024 of the GEMM's work).
constexpr int kGemmRows = 1024;

// x(rows, cols) = 0, rows ld elements apart (one head's slice of dqkv, which
// the attention backwards overwrite by accumulating from zero).
template <typename T>
inline void zero_rows(T* x, int rows, int cols, int ld) {
  for (int r = 0; r < rows; ++r) std::fill_n(x + static_cast<size_t>(r) * ld, cols, T(0));
}

inline void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  for (int m0 = 0; m0 < M; m0 += kGemmRows) {
    const int m = std::min(kGemmRows, M - m0);
    // Rows m0.. of op(A): rows of A, or columns of A when transposed.
    const float* a = A + (ta ? static_cast<size_t>(m0) : static_cast<size_t>(m0) * lda);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                N, K, alpha, a, lda, B, ldb, beta, C + static_cast<size_t>(m0) * ldc, ldc);
  }
}

// One GEMM whose packed panels are the largest gemm() makes, so that the
// pages of OpenBLAS's buffer are resident from then on and a measurement of
// the process includes them: kGemmRows rows of op(A) (its panel of op(A)'s
// rows) and as many columns of op(B) (its panel of op(B)'s columns, up to
// GEMM_P of them: 768 on Haswell), times kGemmWarmUpK of K (more than
// GEMM_Q on any core OpenBLAS tunes for). A and B are the same zeros (read
// only). Thin GEMMs (8 rows or columns) leave part of the panels untouched:
// 0.8 MiB that appeared in training. `scratch` holds kGemmWarmUpFloats
// (8 MiB), which the caller books as start-up workspace.
constexpr int kGemmWarmUpK = 1024;
constexpr size_t kGemmWarmUpFloats = size_t(kGemmRows) * kGemmWarmUpK + size_t(kGemmRows) * kGemmRows;
inline void warm_up_gemm(float* scratch) {
  std::fill(scratch, scratch + kGemmWarmUpFloats, 0.0f);
  const float* a = scratch;  // kGemmRows x K, row-major; op(B) = its transpose
  float* c = scratch + size_t(kGemmRows) * kGemmWarmUpK;
  gemm(false, true, kGemmRows, kGemmRows, kGemmWarmUpK, 1.0f, a, kGemmWarmUpK, a, kGemmWarmUpK,
       0.0f, c, kGemmRows);
}

inline void gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
                 const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// The GEMM of an op under train.precision: A and B rounded to `p` a tile at
// a time into the thread's scratch, each tile's product added in fp32
// (ops/precision.h, RoundingScratch).
void gemm(Precision p, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
// The double ops are the references of the fp32 math only: `p` is fp32 there.
inline void gemm(Precision, bool ta, bool tb, int M, int N, int K, double alpha, const double* A,
                 int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace meshlm::ops
