// Row-major GEMMs on the GPU for the kernels of cuda/ (cuda/blas.cu).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>

#include "ops/precision.h"

namespace meshlm::cuda {

// Row-major C(M,N) = alpha op(A) op(B) + beta C, as ops::gemm on the CPU:
// A, B and C fp32, A and B read at precision `p` (ops/precision.h). A16 and
// B16, where given (bf16 and fp16 only), are A and B already rounded to p,
// read instead of rounding them (Kernels::hold_rounded).
void gemm_rm(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N, int K,
             float alpha, const float* A, int lda, const float* B, int ldb, float beta, float* C,
             int ldc, const void* A16 = nullptr, const void* B16 = nullptr);
// For b in [0, batch): row-major C_b(M,N) = alpha op(A_b) op(B_b) + beta C_b,
// with X_b = X + b * strideX (elements), as ops::gemm on the CPU, on `stream`.
void gemm_strided_batched_rm(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N,
                             int K, float alpha, const float* A, int lda, long long strideA,
                             const float* B, int ldb, long long strideB, float beta, float* C,
                             int ldc, long long strideC, int batch);


// dst(n) = x(n) rounded to precision p (bf16 or fp16; to nearest even, as
// the CPU emulates it), queued on `stream`; dst holds 2-byte elements.
void round_span(ops::Precision p, void* dst, const float* x, size_t n, cudaStream_t stream);

// The stream's buffer of 16-bit GEMM inputs (ops/gpu_workspace.h) with room
// for a, b and c elements of 2 bytes, each copy 256-byte aligned; the third
// pointer is null when c = 0. Valid until the next GEMM or call on the same
// stream: the fused attention rounds its inputs into it as a GEMM would,
// asking for no more than the block's largest GEMM does.
std::array<void*, 3> inputs_16bit(cudaStream_t stream, size_t a, size_t b, size_t c = 0);

}  // namespace meshlm::cuda
