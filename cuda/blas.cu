// Linear layers through cuBLAS: the GPU version of src/ops/matmul.cpp.
//
// meshlm's matrices are row-major; cuBLAS is column-major. A row-major
// C(M,N) = op(A) op(B) is the column-major C^T(N,M) = op(B)^T op(A)^T, so
// gemm_rm below calls cuBLAS with the operands swapped and the same
// transpose flags: the same spelling as the CPU's ops::gemm.
//
// Each host thread has one cuBLAS handle per device, created at its first
// use and kept for the life of the process; every call sets the caller's
// stream on it. FP32 GEMMs run in CUBLAS_DEFAULT_MATH, which uses no TF32
// (that takes CUBLAS_TF32_TENSOR_OP_MATH), so the fp32 backend can be
// compared tightly with the CPU. Under bf16 and fp16 the operands stay fp32
// in memory and the GEMM's compute type, CUBLAS_COMPUTE_32F_FAST_16BF or
// _16F, has cuBLAS convert them to the 16-bit type for the tensor cores and
// accumulate in fp32: the rounding the CPU backend emulates.
#include <cuda_runtime.h>

#include <map>
#include <string>

#include "core/error.h"
#include "cuda/blas.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops_cuda.h"

namespace meshlm::cuda {

namespace {

// The calling thread's handle for the current device, bound to `stream`.
cublasHandle_t blas_handle(cudaStream_t stream) {
  struct Handles {
    std::map<int, cublasHandle_t> by_device;
    ~Handles() {
      for (auto& [device, h] : by_device) cublasDestroy(h);
    }
  };
  thread_local Handles handles;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cublasHandle_t& h = handles.by_device[device];
  if (h == nullptr) {
    CUBLAS_CHECK(cublasCreate(&h));
    CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  }
  CUBLAS_CHECK(cublasSetStream(h, stream));
  return h;
}

cublasOperation_t op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

cublasComputeType_t compute_type(ops::Precision p) {
  switch (p) {
    case ops::Precision::bf16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case ops::Precision::fp16: return CUBLAS_COMPUTE_32F_FAST_16F;
    case ops::Precision::fp32: break;
  }
  return CUBLAS_COMPUTE_32F;
}

// out(N,OC) = bias, row by row.
__global__ void broadcast_bias_kernel(float* out, const float* bias, int N, int OC) {
  const size_t total = size_t(N) * OC;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = bias[i % OC];
}

// dbias(OC) += sum_n dout(n, .) (column_block_sum: a block per 32 columns).
__global__ void bias_backward_kernel(float* dbias, const float* dout, int N, int OC) {
  __shared__ float part[kColumnRows][kWarp];
  const int c = blockIdx.x * kWarp + threadIdx.x % kWarp, r0 = threadIdx.x / kWarp;
  float acc = 0.0f;
  if (c < OC)
    for (int n = r0; n < N; n += kColumnRows) acc += dout[size_t(n) * OC + c];
  acc = column_block_sum(acc, part);
  if (r0 == 0 && c < OC) dbias[c] += acc;
}

std::string dims(int N, int IC, int OC) {
  return "N = " + std::to_string(N) + ", IC = " + std::to_string(IC) + ", OC = " +
         std::to_string(OC);
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int IC,
                    int OC, cudaStream_t stream, ops::Precision p) {
  if (N == 0 || OC == 0) return;
  MESHLM_CHECK(out && inp && w && N > 0 && IC > 0 && OC > 0,
               "cuda::matmul_forward with " + dims(N, IC, OC));
  float beta = 0.0f;
  if (bias != nullptr) {
    // Start from the bias and let the GEMM accumulate onto it (beta = 1).
    broadcast_bias_kernel<<<grid_for(size_t(N) * OC), kThreads, 0, stream>>>(out, bias, N, OC);
    CUDA_CHECK(cudaGetLastError());
    beta = 1.0f;
  }
  gemm_rm(stream, p, false, true, N, OC, IC, 1.0f, inp, IC, w, IC, beta, out, OC);
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int N, int IC, int OC, cudaStream_t stream,
                     ops::Precision p) {
  if (N == 0) return;
  MESHLM_CHECK(dout && N > 0 && IC > 0 && OC > 0 && (dinp == nullptr || w) &&
                   (dw == nullptr || inp),
               "cuda::matmul_backward with " + dims(N, IC, OC));
  if (dinp) gemm_rm(stream, p, false, false, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, dinp, IC);
  if (dw) gemm_rm(stream, p, true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
  if (dbias) {
    const unsigned blocks = static_cast<unsigned>((OC + kWarp - 1) / kWarp);
    bias_backward_kernel<<<blocks, kThreads, 0, stream>>>(dbias, dout, N, OC);
    CUDA_CHECK(cudaGetLastError());
  }
}

void gemm_rm(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N, int K,
             float alpha, const float* A, int lda, const float* B, int ldb, float beta, float* C,
             int ldc) {
  if (p == ops::Precision::fp32) {
    CUBLAS_CHECK(cublasSgemm(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha, B, ldb, A, lda,
                             &beta, C, ldc));
    return;
  }
  CUBLAS_CHECK(cublasGemmEx(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha, B, CUDA_R_32F,
                            ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, compute_type(p),
                            CUBLAS_GEMM_DEFAULT));
}

void gemm_strided_batched_rm(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N,
                             int K, float alpha, const float* A, int lda, long long strideA,
                             const float* B, int ldb, long long strideB, float beta, float* C,
                             int ldc, long long strideC, int batch) {
  if (p == ops::Precision::fp32) {
    CUBLAS_CHECK(cublasSgemmStridedBatched(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha, B,
                                           ldb, strideB, A, lda, strideA, &beta, C, ldc, strideC,
                                           batch));
    return;
  }
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha, B,
                                          CUDA_R_32F, ldb, strideB, A, CUDA_R_32F, lda, strideA,
                                          &beta, C, CUDA_R_32F, ldc, strideC, batch,
                                          compute_type(p), CUBLAS_GEMM_DEFAULT));
}

}  // namespace meshlm::cuda
