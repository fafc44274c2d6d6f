// Row-major GEMM on the CPU through CBLAS (OpenBLAS, OpenMP flavour), one
// spelling for float and double so the ops can be templates; and the thread
// count both use.
//   C(M,N) = alpha * op(A) op(B) + beta * C, op = transpose when ta/tb.
#pragma once

#include <cblas.h>
#include <omp.h>

#include "ops/precision.h"

namespace meshlm::ops {

// The threads of this rank's own OpenMP loops and of OpenBLAS: one pool, as
// both are OpenMP (the OpenMP flavour of OpenBLAS; see CMakeLists.txt).
inline void set_threads(int n) {
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

inline void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

inline void gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
                 const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// The GEMM of an op under train.precision: A and B rounded to `p` (a copy
// each, in per-thread scratch), then the fp32 GEMM (ops/precision.cpp).
void gemm(Precision p, bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
// The double ops are the references of the fp32 math only: `p` is fp32 there.
inline void gemm(Precision, bool ta, bool tb, int M, int N, int K, double alpha, const double* A,
                 int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace meshlm::ops
