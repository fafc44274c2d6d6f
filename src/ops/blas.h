// Row-major GEMM on the CPU through CBLAS (OpenBLAS, OpenMP flavour), one
// spelling for float and double so the ops can be templates.
//   C(M,N) = alpha * op(A) op(B) + beta * C, op = transpose when ta/tb.
#pragma once

#include <cblas.h>

namespace meshlm::ops {

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

}  // namespace meshlm::ops
