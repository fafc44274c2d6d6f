// Row-major GEMMs on the GPU for the kernels of cuda/ (cuda/blas.cu).
#pragma once

#include <cuda_runtime.h>

#include "ops/precision.h"

namespace meshlm::cuda {

// Row-major C(M,N) = alpha op(A) op(B) + beta C, as ops::gemm on the CPU:
// A, B and C fp32, A and B read at precision `p` (ops/precision.h).
void gemm_rm(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N, int K,
             float alpha, const float* A, int lda, const float* B, int ldb, float beta, float* C,
             int ldc);
// For b in [0, batch): row-major C_b(M,N) = alpha op(A_b) op(B_b) + beta C_b,
// with X_b = X + b * strideX (elements), as ops::gemm on the CPU, on `stream`.
void gemm_strided_batched_rm(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N,
                             int K, float alpha, const float* A, int lda, long long strideA,
                             const float* B, int ldb, long long strideB, float beta, float* C,
                             int ldc, long long strideC, int batch);

}  // namespace meshlm::cuda
