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
// compared tightly with the CPU. Under bf16 and fp16 each operand is rounded
// (to nearest even, as the CPU emulates it) into a 16-bit copy of the memory
// span it touches, keeping its strides, and cuBLAS multiplies the copies on
// the tensor cores with fp32 accumulation and fp32 output. (The compute type
// CUBLAS_COMPUTE_32F_FAST_16BF on fp32 operands only *allows* cuBLAS to
// round: on an H100 it gave products far closer to fp32 than to the bf16
// rounding, so it fixes no precision.)
#include <cuda_runtime.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <map>
#include <string>

#include "core/alloc.h"

#include "core/error.h"
#include "cuda/blas.cuh"
#include "cuda/cublas_lib.h"
#include "cuda/cuda_check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops_cuda.h"
#include "cuda/scratch.cuh"
#include "ops/gpu_workspace.h"

namespace meshlm::cuda {

namespace {

// The calling thread's handle for the current device, bound to `stream`.
cublasHandle_t blas_handle(cudaStream_t stream) {
  struct Handles {
    std::map<int, cublasHandle_t> by_device;
    ~Handles() {
      for (auto& [device, h] : by_device) cublas().destroy(h);
    }
  };
  thread_local Handles handles;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cublasHandle_t& h = handles.by_device[device];
  if (h == nullptr) {
    CUBLAS_CHECK(cublas().create(&h));
    CUBLAS_CHECK(cublas().set_math_mode(h, CUBLAS_DEFAULT_MATH));
  }
  CUBLAS_CHECK(cublas().set_stream(h, stream));
  return h;
}

cublasOperation_t op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

// ---- 16-bit copies of GEMM inputs --------------------------------------------

__global__ void round_to_bf16_kernel(__nv_bfloat16* out, const float* in, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}
__global__ void round_to_fp16_kernel(__half* out, const float* in, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(in[i]);  // beyond 65504 (after rounding): infinity
}

// The 16-bit copies of the two inputs of the GEMMs queued on one stream
// (workspace, grown on demand to exactly the largest pair asked for, as
// ops/gpu_workspace.h tells the memory prediction; reused by the next GEMM on
// the stream, which runs after this one). Per host thread, kept for the life
// of the process.
class Inputs16 {
public:
  // Room for a, b and c elements of 2 bytes; returns the three copies
  // (the third null when c = 0).
  std::array<void*, 3> reserve(cudaStream_t stream, size_t a, size_t b, size_t c = 0) {
    const size_t bytes = ops::gemm_16bit_copies_bytes(a, b, c);
    Buffer*& buf = by_stream_[stream];
    if (buf == nullptr || buf->bytes() < bytes) {
      // The stream's earlier GEMMs may still read the old copies.
      CUDA_CHECK(cudaStreamSynchronize(stream));
      delete buf;
      buf = new Buffer(bytes, MemCategory::workspace, "gemm.inputs_16bit", Device::cuda);
    }
    // Each copy after the first starts at a multiple of 256 bytes.
    auto aligned = [](size_t n) { return (2 * n + 255) / 256 * 256; };
    char* base = buf->as<char>();
    return {base, base + aligned(a), c == 0 ? nullptr : base + aligned(a) + aligned(b)};
  }

private:
  // Never freed: a thread's copies outlive every stream it uses, and the
  // allocator must not see a release after the process has torn it down.
  std::map<cudaStream_t, Buffer*> by_stream_;
};

Inputs16& inputs16() {
  thread_local Inputs16* copies = new Inputs16;
  return *copies;
}

// Rounds x[0, n) into `dst` at precision p (bf16 or fp16).
void round_span(ops::Precision p, void* dst, const float* x, size_t n, cudaStream_t stream) {
  if (p == ops::Precision::bf16)
    round_to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), x, n);
  else
    round_to_fp16_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<__half*>(dst), x, n);
  CUDA_CHECK(cudaGetLastError());
}

// The 16-bit copies of A[0, a) and B[0, b), queued on `stream`.
std::pair<void*, void*> round_inputs(cudaStream_t stream, ops::Precision p, const float* A, size_t a,
                                     const float* B, size_t b) {
  const auto copies = inputs16().reserve(stream, a, b);
  round_span(p, copies[0], A, a, stream);
  round_span(p, copies[1], B, b, stream);
  return {copies[0], copies[1]};
}

cudaDataType_t data_type(ops::Precision p) {
  return p == ops::Precision::bf16 ? CUDA_R_16BF : CUDA_R_16F;
}

// out(N,OC) = bias, row by row.
__global__ void broadcast_bias_kernel(float* out, const float* bias, int N, int OC) {
  const size_t total = size_t(N) * OC;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = bias[i % OC];
}

// The partial sums over a chunk of rows of dout(., c) (cuda/scratch.cuh;
// column_block_sum within the block of 32 columns).
__global__ void bias_partials_kernel(float* partials, const float* dout, int N, int OC) {
  __shared__ float part[kColumnRows][kWarp];
  const int c = blockIdx.x * kWarp + threadIdx.x % kWarp, r0 = threadIdx.x / kWarp;
  int begin, end;
  chunk_rows(N, begin, end);
  float acc = 0.0f;
  if (c < OC)
    for (int n = begin + r0; n < end; n += kColumnRows) acc += dout[size_t(n) * OC + c];
  acc = column_block_sum(acc, part);
  if (r0 == 0 && c < OC) partials[size_t(blockIdx.y) * OC + c] = acc;
}

// gemm_rm on 16-bit copies already made (precision p).
void gemm_rm_16(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N, int K,
                float alpha, const void* A16, int lda, const void* B16, int ldb, float beta,
                float* C, int ldc) {
  CUBLAS_CHECK(cublas().gemm_ex(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha, B16,
                                data_type(p), ldb, A16, data_type(p), lda, &beta, C, CUDA_R_32F,
                                ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

std::string dims(int N, int IC, int OC) {
  return "N = " + std::to_string(N) + ", IC = " + std::to_string(IC) + ", OC = " +
         std::to_string(OC);
}

}  // namespace

std::array<void*, 3> inputs_16bit(cudaStream_t stream, size_t a, size_t b, size_t c) {
  return inputs16().reserve(stream, a, b, c);
}

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
  if (dinp && dw && p != ops::Precision::fp32) {
    // dout rounded once for both GEMMs: copies of dout, w and inp.
    const size_t n_dout = size_t(N) * OC, n_w = size_t(OC) * IC, n_inp = size_t(N) * IC;
    const auto copies = inputs16().reserve(stream, n_dout, n_w, n_inp);
    round_span(p, copies[0], dout, n_dout, stream);
    round_span(p, copies[1], w, n_w, stream);
    round_span(p, copies[2], inp, n_inp, stream);
    gemm_rm_16(stream, p, false, false, N, IC, OC, 1.0f, copies[0], OC, copies[1], IC, 1.0f, dinp,
               IC);
    gemm_rm_16(stream, p, true, false, OC, IC, N, 1.0f, copies[0], OC, copies[2], IC, 1.0f, dw, IC);
  } else {
    if (dinp) gemm_rm(stream, p, false, false, N, IC, OC, 1.0f, dout, OC, w, IC, 1.0f, dinp, IC);
    if (dw) gemm_rm(stream, p, true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
  }
  if (dbias) {  // dbias(OC) += sum_n dout(n, .)
    const dim3 grid = column_partials_grid(N, OC);
    float* partials = column_partials(stream, size_t(grid.y) * OC);
    bias_partials_kernel<<<grid, kThreads, 0, stream>>>(partials, dout, N, OC);
    CUDA_CHECK(cudaGetLastError());
    add_column_partials(dbias, partials, static_cast<int>(grid.y), OC, stream);
  }
}


void gemm_rm(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N, int K,
             float alpha, const float* A, int lda, const float* B, int ldb, float beta, float* C,
             int ldc) {
  if (p == ops::Precision::fp32 || M == 0 || N == 0 || K == 0) {
    CUBLAS_CHECK(cublas().sgemm(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha, B, ldb, A, lda,
                             &beta, C, ldc));
    return;
  }
  const auto [a, b] = ops::gemm_input_spans(ta, tb, M, N, K, lda, ldb);
  const auto [A16, B16] = round_inputs(stream, p, A, a, B, b);
  gemm_rm_16(stream, p, ta, tb, M, N, K, alpha, A16, lda, B16, ldb, beta, C, ldc);
}

void gemm_strided_batched_rm(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N,
                             int K, float alpha, const float* A, int lda, long long strideA,
                             const float* B, int ldb, long long strideB, float beta, float* C,
                             int ldc, long long strideC, int batch) {
  if (p == ops::Precision::fp32 || M == 0 || N == 0 || K == 0 || batch == 0) {
    CUBLAS_CHECK(cublas().sgemm_strided_batched(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha, B,
                                           ldb, strideB, A, lda, strideA, &beta, C, ldc, strideC,
                                           batch));
    return;
  }
  const auto [a, b] = ops::gemm_input_spans(ta, tb, M, N, K, lda, ldb, strideA, strideB, batch);
  const auto [A16, B16] = round_inputs(stream, p, A, a, B, b);
  CUBLAS_CHECK(cublas().gemm_strided_batched_ex(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha,
                                          B16, data_type(p), ldb, strideB, A16, data_type(p), lda,
                                          strideA, &beta, C, CUDA_R_32F, ldc, strideC, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace meshlm::cuda
