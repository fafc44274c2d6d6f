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
#include "cuda/pack16.cuh"
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

// out(n) = in(n) rounded to nearest even: four at a time where `by4` (in
// 16-byte aligned; out, a 16-bit copy, is 256-byte aligned), then one.
template <typename Out>
__global__ void round_to_16bit_kernel(Out* out, const float* in, size_t n, bool by4) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t n4 = by4 ? n / 4 : 0;
  for (size_t i = first; i < n4; i += stride) {
    const float4 x = reinterpret_cast<const float4*>(in)[i];
    reinterpret_cast<uint2*>(out)[i] = make_uint2(pack_16bit<Out>(x.x, x.y), pack_16bit<Out>(x.z, x.w));
  }
  for (size_t i = 4 * n4 + first; i < n; i += stride) {
    const uint32_t two = pack_16bit<Out>(in[i], 0.0f);
    out[i] = *reinterpret_cast<const Out*>(&two);
  }
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

  // Frees the copies of `stream`, whose work has ended.
  void release(cudaStream_t stream) {
    const auto it = by_stream_.find(stream);
    if (it == by_stream_.end()) return;
    delete it->second;
    by_stream_.erase(it);
  }

private:
  // The map is never destroyed (the allocator must not see a release after
  // the process has torn it down); a stream's copies are freed with its
  // device context (release_gemm_copies).
  std::map<cudaStream_t, Buffer*> by_stream_;
};

Inputs16& inputs16() {
  thread_local Inputs16* copies = new Inputs16;
  return *copies;
}

}  // namespace

void release_gemm_copies(cudaStream_t stream) { inputs16().release(stream); }

namespace {

// One input of a GEMM at bf16 or fp16: x[0, n), and its 16-bit copy where
// one is held (Kernels::hold_rounded), else null.
struct Operand {
  const float* x = nullptr;
  size_t n = 0;
  const void* held = nullptr;
};

// The 16-bit copies of up to three operands, queued on `stream`: a held one
// as it is, the others rounded into the stream's buffer, which makes room
// for those alone (n = 0: no operand).
// With round_a = false, a's copy is given room but left for the caller to write.
std::array<const void*, 3> rounded(cudaStream_t stream, ops::Precision p, Operand a, Operand b,
                                   Operand c = {}, bool round_a = true) {
  const std::array<Operand, 3> in{a, b, c};
  auto need = [](const Operand& o) { return o.held ? 0 : o.n; };
  const auto copies = inputs16().reserve(stream, need(a), need(b), need(c));
  std::array<const void*, 3> out{};
  for (int i = 0; i < 3; ++i) {
    if (in[i].held || in[i].n == 0) {
      out[i] = in[i].held;
      continue;
    }
    if (i > 0 || round_a) round_span(p, copies[i], in[i].x, in[i].n, stream);
    out[i] = copies[i];
  }
  return out;
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
// column_block_sum within the block of 32 columns), and where dout16 is
// given dout's 16-bit copy from the same read: the bits round_span gives
// each element.
template <typename Out>
__global__ void bias_partials_kernel(float* partials, Out* dout16, const float* dout, int N,
                                     int OC) {
  __shared__ float part[kColumnRows][kWarp];
  const int c = blockIdx.x * kWarp + threadIdx.x % kWarp, r0 = threadIdx.x / kWarp;
  int begin, end;
  chunk_rows(N, begin, end);
  float acc = 0.0f;
  if (c < OC)
    for (int n = begin + r0; n < end; n += kColumnRows) {
      const size_t i = size_t(n) * OC + c;
      const float x = dout[i];
      acc += x;
      if (dout16 == nullptr) continue;
      const uint32_t two = pack_16bit<Out>(x, 0.0f);
      dout16[i] = *reinterpret_cast<const Out*>(&two);
    }
  acc = column_block_sum(acc, part);
  if (r0 == 0 && c < OC) partials[size_t(blockIdx.y) * OC + c] = acc;
}

// dbias(OC) += sum_n dout(n, .), in two passes (cuda/scratch.cuh); with
// copy16, dout's 16-bit copy at precision p made by the first.
void bias_gradient(float* dbias, const float* dout, int N, int OC, cudaStream_t stream,
                   ops::Precision p = ops::Precision::fp32, void* copy16 = nullptr) {
  const dim3 grid = column_partials_grid(N, OC);
  float* partials = column_partials(stream, size_t(grid.y) * OC);
  if (copy16 != nullptr && p == ops::Precision::fp16)
    bias_partials_kernel<<<grid, kThreads, 0, stream>>>(partials, static_cast<__half*>(copy16),
                                                        dout, N, OC);
  else
    bias_partials_kernel<<<grid, kThreads, 0, stream>>>(
        partials, static_cast<__nv_bfloat16*>(copy16), dout, N, OC);
  CUDA_CHECK(cudaGetLastError());
  add_column_partials(dbias, partials, static_cast<int>(grid.y), OC, stream);
}

// gemm_rm on 16-bit copies already made (precision p).
void gemm_rm_16(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N, int K,
                float alpha, const void* A16, int lda, const void* B16, int ldb, float beta,
                float* C, int ldc) {
  CUBLAS_CHECK(cublas().gemm_ex(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha, B16,
                                data_type(p), ldb, A16, data_type(p), lda, &beta, C, CUDA_R_32F,
                                ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---- cuBLASLt: out = inp w^T + bias with the bias in the GEMM's epilogue ------
//
// At bf16 and fp16 matmul_forward's GEMM adds the bias as it writes out
// (CUBLASLT_EPILOGUE_BIAS), where the fp32 path first writes the bias into
// every row and lets the GEMM read it back (beta = 1): 8 bytes less per
// output element. In cuBLASLt's column-major terms out^T(OC, N) = W(OC, IC)
// inp^T(IC, N), A = w stored (IC, OC) and transposed, B = inp stored (IC, N),
// the bias one value per row of out^T. No workspace: the memory prediction
// knows none. Where cuBLASLt offers no algorithm (heuristics for the shape and
// the pointers' alignment), matmul_forward takes the fp32 path's two steps.

// The largest power of two (at most 256) that divides the address.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

struct LtPlan {
  bool ok = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// Per host thread: a cuBLASLt handle per device and the plan of every shape
// seen (descriptors and the heuristic's algorithm), kept for the process.
class LtPlans {
public:
  // The plan for out(N, OC) = inp(N, IC) w(OC, IC)^T + bias at precision p,
  // for pointers of these alignments; ok = false where there is none.
  const LtPlan& get(int device, ops::Precision p, int N, int IC, int OC,
                    const std::array<uint32_t, 4>& align, const float* bias) {
    const Key key{device, static_cast<int>(p), N, IC, OC, align};
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    LtPlan& plan = plans_[key];
    const CublasLtApi& lt = cublaslt();
    cublasLtHandle_t& h = handles_[device];
    if (h == nullptr) CUBLAS_CHECK(lt.create(&h));
    const cudaDataType_t in = data_type(p);
    CUBLAS_CHECK(lt.desc_create(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = CUDA_R_32F;
    CUBLAS_CHECK(lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    CUBLAS_CHECK(lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    CUBLAS_CHECK(lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                             sizeof(bias_type)));
    CUBLAS_CHECK(lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    CUBLAS_CHECK(lt.layout_create(&plan.a, in, IC, OC, IC));
    CUBLAS_CHECK(lt.layout_create(&plan.b, in, IC, N, IC));
    CUBLAS_CHECK(lt.layout_create(&plan.d, CUDA_R_32F, OC, N, OC));
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(lt.pref_create(&pref));
    const uint64_t workspace = 0;
    CUBLAS_CHECK(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                             sizeof(workspace)));
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      CUBLAS_CHECK(lt.pref_set(pref, aligns[i], &align[i], sizeof(uint32_t)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = lt.heuristic(h, plan.desc, plan.a, plan.b, plan.d, plan.d, pref, 1,
                                           &result, &found);
    lt.pref_destroy(pref);
    plan.ok = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (plan.ok) plan.algo = result.algo;
    return plan;
  }
  cublasLtHandle_t handle(int device) { return handles_[device]; }

private:
  struct Key {
    int device, p, N, IC, OC;
    std::array<uint32_t, 4> align;
    auto operator<=>(const Key&) const = default;
  };
  std::map<Key, LtPlan> plans_;
  std::map<int, cublasLtHandle_t> handles_;
};

LtPlans& lt_plans() {
  thread_local LtPlans* plans = new LtPlans;  // kept for the process, as the handles
  return *plans;
}

// out = inp16 w16^T + bias through cuBLASLt; false (nothing queued) where it
// offers no algorithm.
bool lt_bias_gemm(cudaStream_t stream, ops::Precision p, const void* inp16, const void* w16,
                  const float* bias, float* out, int N, int IC, int OC) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  // The bias pointer's alignment counts as well (the heuristic reads its value).
  const std::array<uint32_t, 4> align{alignment_of(w16), alignment_of(inp16), alignment_of(out),
                                      std::min(alignment_of(out), alignment_of(bias))};
  LtPlans& plans = lt_plans();
  const LtPlan& plan = plans.get(device, p, N, IC, OC, align, bias);
  if (!plan.ok) return false;
  const CublasLtApi& lt = cublaslt();
  CUBLAS_CHECK(lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(lt.matmul(plans.handle(device), plan.desc, &alpha, w16, plan.a, inp16, plan.b,
                         &beta, out, plan.d, out, plan.d, &plan.algo, nullptr, 0, stream));
  return true;
}

std::string dims(int N, int IC, int OC) {
  return "N = " + std::to_string(N) + ", IC = " + std::to_string(IC) + ", OC = " +
         std::to_string(OC);
}

}  // namespace

void round_span(ops::Precision p, void* dst, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool by4 = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const unsigned grid = grid_for(by4 ? n / 4 + 1 : n);
  if (p == ops::Precision::bf16)
    round_to_16bit_kernel<<<grid, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), x, n, by4);
  else
    round_to_16bit_kernel<<<grid, kThreads, 0, stream>>>(static_cast<__half*>(dst), x, n, by4);
  CUDA_CHECK(cudaGetLastError());
}

std::array<void*, 3> inputs_16bit(cudaStream_t stream, size_t a, size_t b, size_t c) {
  return inputs16().reserve(stream, a, b, c);
}

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int IC,
                    int OC, cudaStream_t stream, ops::Precision p, const Held16& held) {
  if (N == 0 || OC == 0) return;
  MESHLM_CHECK(out && inp && w && N > 0 && IC > 0 && OC > 0,
               "cuda::matmul_forward with " + dims(N, IC, OC));
  if (p != ops::Precision::fp32) {
    const auto [x16, w16, unused] = rounded(stream, p, {inp, size_t(N) * IC, held.inp},
                                            {w, size_t(OC) * IC, held.w});
    float beta = 0.0f;
    if (bias != nullptr) {
      if (lt_bias_gemm(stream, p, x16, w16, bias, out, N, IC, OC)) return;
      broadcast_bias_kernel<<<grid_for(size_t(N) * OC), kThreads, 0, stream>>>(out, bias, N, OC);
      CUDA_CHECK(cudaGetLastError());
      beta = 1.0f;
    }
    gemm_rm_16(stream, p, false, true, N, OC, IC, 1.0f, x16, IC, w16, IC, beta, out, OC);
    return;
  }
  MESHLM_CHECK(held.inp == nullptr && held.w == nullptr && held.dout == nullptr,
               "cuda::matmul_forward: 16-bit copies at fp32");
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
                     ops::Precision p, const Held16& held) {
  if (N == 0) return;
  MESHLM_CHECK(dout && N > 0 && IC > 0 && OC > 0 && (dinp == nullptr || w) &&
                   (dw == nullptr || inp),
               "cuda::matmul_backward with " + dims(N, IC, OC));
  if (p != ops::Precision::fp32) {
    // dout rounded once for both GEMMs; each operand only where no copy is
    // held. With a bias, dout's copy comes with the bias gradient's partial
    // sums from one read of dout.
    const size_t n_dout = size_t(N) * OC, n_w = size_t(OC) * IC, n_inp = size_t(N) * IC;
    const bool fused = dbias != nullptr && held.dout == nullptr;
    const auto [d16, w16, x16] =
        rounded(stream, p, {dout, n_dout, held.dout}, {w, dinp ? n_w : 0, held.w},
                {inp, dw ? n_inp : 0, held.inp}, /*round_a=*/!fused);
    if (fused) {
      bias_gradient(dbias, dout, N, OC, stream, p, const_cast<void*>(d16));
      dbias = nullptr;  // done
    }
    if (dinp)
      gemm_rm_16(stream, p, false, false, N, IC, OC, 1.0f, d16, OC, w16, IC, 0.0f, dinp, IC);
    if (dw) gemm_rm_16(stream, p, true, false, OC, IC, N, 1.0f, d16, OC, x16, IC, 1.0f, dw, IC);
  } else {
    MESHLM_CHECK(held.inp == nullptr && held.w == nullptr && held.dout == nullptr,
                 "cuda::matmul_backward: 16-bit copies at fp32");
    if (dinp) gemm_rm(stream, p, false, false, N, IC, OC, 1.0f, dout, OC, w, IC, 0.0f, dinp, IC);
    if (dw) gemm_rm(stream, p, true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
  }
  if (dbias) bias_gradient(dbias, dout, N, OC, stream);
}


void gemm_rm(cudaStream_t stream, ops::Precision p, bool ta, bool tb, int M, int N, int K,
             float alpha, const float* A, int lda, const float* B, int ldb, float beta, float* C,
             int ldc, const void* A16, const void* B16) {
  if (p == ops::Precision::fp32 || M == 0 || N == 0 || K == 0) {
    MESHLM_CHECK(p != ops::Precision::fp32 || (A16 == nullptr && B16 == nullptr),
                 "cuda::gemm_rm: 16-bit copies at fp32");
    CUBLAS_CHECK(cublas().sgemm(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha, B, ldb, A, lda,
                             &beta, C, ldc));
    return;
  }
  const auto [a, b] = ops::gemm_input_spans(ta, tb, M, N, K, lda, ldb);
  const auto [a16, b16, unused] = rounded(stream, p, {A, a, A16}, {B, b, B16});
  gemm_rm_16(stream, p, ta, tb, M, N, K, alpha, a16, lda, b16, ldb, beta, C, ldc);
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
  const auto [A16, B16, unused] = rounded(stream, p, {A, a}, {B, b});
  CUBLAS_CHECK(cublas().gemm_strided_batched_ex(blas_handle(stream), op(tb), op(ta), N, M, K, &alpha,
                                          B16, data_type(p), ldb, strideB, A16, data_type(p), lda,
                                          strideA, &beta, C, CUDA_R_32F, ldc, strideC, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace meshlm::cuda
