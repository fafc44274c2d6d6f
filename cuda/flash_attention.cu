// Causal self-attention fused into one kernel for the forward and two for the
// backward (train.attention = flash), with the tiles multiplied on the tensor
// cores (WMMA, 16 x 16 x 16, fp32 accumulation). The reference is
// ops::flash_attention_* on the CPU (the same function and the same kept
// log-sum-exp); the strided-batched version of attention.cu computes the same
// output from the probabilities.
//
// Tiles: a block of kFlashThreads (4 warps) takes 64 rows (queries, or keys
// in dK/dV) of one (batch row, head) pair; each warp owns 16 of them. The 64
// x HS tiles of Q, K, V and dO are read from fp32 global memory and rounded to
// the precision's 16-bit type in shared memory as they are stored, so every
// product reads its inputs rounded as the reference's GEMMs do; the scores,
// the softmax, the log-sum-exp and every accumulator are fp32.
//
//   forward, per query block: for each key block up to the diagonal,
//     S = Q K^T (16 x 64 per warp), online softmax (running max m and sum l
//     per row; P = exp(scale S - m) rounded to 16 bits), O = alpha O + P V.
//     Then out = O / l and lse = m + log l.
//   dK, dV, per key block: for each query block from the diagonal on,
//     P^T = exp(scale K Q^T - lse), dV += P^T dO, dP^T = V dO^T,
//     dS^T = P^T (dP^T - D) scale, dK += dS^T Q.
//   dQ, per query block: for each key block up to the diagonal,
//     the same P and dS, dQ += dS K.
//   D = rowsum(dO * O) first, one warp per row (the delta scratch).
// Every output element is written by one thread in a fixed order: no atomics,
// the same bits every run. Rows past T are zeros in shared memory and never
// written back.
//
// The WMMA fragments' element layout is unspecified, so a warp stores each
// product to its own fp32 scratch in shared memory and works on rows there:
// lane l takes row l / 2 of the warp's 16 and half (l % 2) of its columns.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops_cuda.h"

namespace meshlm::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kFlashRows = 64;  // rows of a block's tile (queries or keys)
constexpr int kWarpRows = 16;   // rows of a warp: one WMMA tile high
constexpr int kFlashWarps = kFlashRows / kWarpRows;
constexpr int kFlashThreads = kFlashWarps * kWarp;
constexpr int kPad16 = 8;  // 16-bit elements of padding per shared row: 16 bytes
constexpr int kPad32 = 4;  // floats of padding per shared fp32 row: 16 bytes

template <typename In>
__device__ __forceinline__ In to_16bit(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 to_16bit<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half to_16bit<__half>(float x) {
  return __float2half_rn(x);
}

// Shared-memory row lengths: 16-bit tiles (HS wide), 16-bit P or dS (64
// wide), fp32 scratch (64 or HS wide). All keep WMMA's 32-byte alignment of
// every 16-row, 16-column corner.
template <int HS>
struct Ld {
  static constexpr int tile = HS + kPad16;
  static constexpr int p = kFlashRows + kPad16;
  static constexpr int f32 = (HS > kFlashRows ? HS : kFlashRows) + kPad32;
  static constexpr size_t tile_bytes = size_t(kFlashRows) * tile * 2;
  static constexpr size_t warp_p_bytes = size_t(kWarpRows) * p * 2;
  static constexpr size_t warp_f32_bytes = size_t(kWarpRows) * f32 * 4;
};

// Rows [r0, r0 + 64) of a (T, HS) matrix whose rows are ld floats apart,
// rounded to In, into a shared tile; rows past T are zeros.
template <typename In, int HS>
__device__ void load_tile(In* dst, const float* src, int ld, int r0, int Tn) {
  for (int i = threadIdx.x; i < kFlashRows * HS; i += kFlashThreads) {
    const int r = i / HS, c = i % HS, t = r0 + r;
    dst[r * Ld<HS>::tile + c] = to_16bit<In>(t < Tn ? src[static_cast<size_t>(t) * ld + c] : 0.0f);
  }
}

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename In, typename Layout>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, In, Layout>;
template <typename In, typename Layout>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, In, Layout>;

// out(16 x 64) = A(16 x HS) B(HS x 64) into fp32 scratch (row-major, ld):
// A's rows are `a` (row-major, lda), B's columns are the 64 rows of `b`
// (row-major, ldb), i.e. out = a b^T.
template <typename In, int K>
__device__ void product_abt(float* out, int ld, const In* a, int lda, const In* b, int ldb) {
  Acc acc[kFlashRows / 16];
#pragma unroll
  for (int n = 0; n < kFlashRows / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
  for (int kk = 0; kk < K; kk += 16) {
    FragA<In, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + kk, lda);
#pragma unroll
    for (int n = 0; n < kFlashRows / 16; ++n) {
      FragB<In, wmma::col_major> fb;
      wmma::load_matrix_sync(fb, b + n * 16 * ldb + kk, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
#pragma unroll
  for (int n = 0; n < kFlashRows / 16; ++n)
    wmma::store_matrix_sync(out + n * 16, acc[n], ld, wmma::mem_row_major);
}

// acc[HS / 16] (16 x HS) += A(16 x 64) B(64 x HS), both row-major.
template <typename In, int HS>
__device__ void accumulate_ab(Acc (&acc)[HS / 16], const In* a, int lda, const In* b, int ldb) {
#pragma unroll
  for (int kk = 0; kk < kFlashRows; kk += 16) {
    FragA<In, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + kk, lda);
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      FragB<In, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b + kk * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// dst rows [r0, r0 + 16) of a (T, HS) matrix with rows ld floats apart +=
// acc, through the warp's fp32 scratch; rows past T are skipped.
template <int HS>
__device__ void add_rows(float* dst, int ld, int r0, int Tn, Acc (&acc)[HS / 16], float* scratch) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int n = 0; n < HS / 16; ++n)
    wmma::store_matrix_sync(scratch + n * 16, acc[n], Ld<HS>::f32, wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < kWarpRows * HS; i += kWarp) {
    const int r = i / HS, c = i % HS;
    if (r0 + r < Tn) dst[static_cast<size_t>(r0 + r) * ld + c] += scratch[r * Ld<HS>::f32 + c];
  }
  __syncwarp();
}

template <typename In, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(float* out, float* lse, const float* qkv, int Tn, int C, int NH,
                         float scale) {
  using L = Ld<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  In* sQ = reinterpret_cast<In*>(smem);
  In* sK = reinterpret_cast<In*>(smem + L::tile_bytes);
  In* sV = reinterpret_cast<In*>(smem + 2 * L::tile_bytes);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* sS = reinterpret_cast<float*>(smem + 3 * L::tile_bytes + warp * L::warp_f32_bytes);
  In* sP = reinterpret_cast<In*>(smem + 3 * L::tile_bytes + kFlashWarps * L::warp_f32_bytes +
                                 warp * L::warp_p_bytes);

  // The longest query blocks (most keys) first.
  const int qb = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y;
  const int b = bh / NH, h = bh % NH, C3 = 3 * C, t0 = qb * kFlashRows;
  const float* q = qkv + static_cast<size_t>(b) * Tn * C3 + h * HS;
  const float* k = q + C;
  const float* v = q + 2 * C;
  load_tile<In, HS>(sQ, q, C3, t0, Tn);

  constexpr int kHalf = kFlashRows / 2, kOutCols = HS / 2;
  const int r = lane / 2, half = lane % 2;
  const int t = t0 + warp * kWarpRows + r;  // this lane's query
  float m = -INFINITY, l = 0.0f, o[kOutCols];
#pragma unroll
  for (int i = 0; i < kOutCols; ++i) o[i] = 0.0f;

  for (int kb = 0; kb <= qb; ++kb) {
    const int s0 = kb * kFlashRows;
    __syncthreads();  // every warp is done with the last K and V (and sQ is stored)
    load_tile<In, HS>(sK, k, C3, s0, Tn);
    load_tile<In, HS>(sV, v, C3, s0, Tn);
    __syncthreads();
    product_abt<In, HS>(sS, L::f32, sQ + warp * kWarpRows * L::tile, L::tile, sK, L::tile);
    __syncwarp();
    // The online softmax of the lane's half row; key s0 + c is masked past t.
    const float* srow = sS + r * L::f32 + half * kHalf;
    const int c0 = s0 + half * kHalf;
    float mx = -INFINITY;
    for (int j = 0; j < kHalf; ++j)
      if (c0 + j <= t) mx = fmaxf(mx, srow[j] * scale);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    // Key 0 is in the first block and every query sees it: m_new is finite.
    const float m_new = fmaxf(m, mx), alpha = expf(m - m_new);
    float sum = 0.0f;
    In* prow = sP + r * L::p + half * kHalf;
    for (int j = 0; j < kHalf; ++j) {
      const float p = c0 + j <= t ? expf(srow[j] * scale - m_new) : 0.0f;
      sum += p;
      prow[j] = to_16bit<In>(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    __syncwarp();  // sP written, sS read: the warp's P V may overwrite sS
    Acc pv[HS / 16];
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(pv[n], 0.0f);
    accumulate_ab<In, HS>(pv, sP, L::p, sV, L::tile);
#pragma unroll
    for (int n = 0; n < HS / 16; ++n)
      wmma::store_matrix_sync(sS + n * 16, pv[n], L::f32, wmma::mem_row_major);
    __syncwarp();
    const float* pvrow = sS + r * L::f32 + half * kOutCols;
#pragma unroll
    for (int i = 0; i < kOutCols; ++i) o[i] = o[i] * alpha + pvrow[i];
    __syncwarp();  // read before the next block's S overwrites it
  }
  if (t < Tn) {
    const float inv = 1.0f / l;
    float* y = out + (static_cast<size_t>(b) * Tn + t) * C + h * HS + half * kOutCols;
#pragma unroll
    for (int i = 0; i < kOutCols; ++i) y[i] = o[i] * inv;
    if (half == 0) lse[static_cast<size_t>(bh) * Tn + t] = m + logf(l);
  }
}

// D(b,h,t) = sum_d dout(b,t,hHS+d) out(b,t,hHS+d): one warp per (t, h), blockIdx.y = b.
__global__ void flash_delta_kernel(float* delta, const float* dout, const float* out, int Tn,
                                   int C, int NH) {
  const int HS = C / NH;
  const long long rr = warp_row(static_cast<long long>(Tn) * NH);
  if (rr < 0) return;
  const int b = blockIdx.y, t = static_cast<int>(rr / NH), h = static_cast<int>(rr % NH);
  const size_t off = (static_cast<size_t>(b) * Tn + t) * C + static_cast<size_t>(h) * HS;
  float acc = 0.0f;
  for (int d = threadIdx.x % kWarp; d < HS; d += kWarp) acc += dout[off + d] * out[off + d];
  acc = warp_sum(acc);
  if (threadIdx.x % kWarp == 0) delta[(static_cast<size_t>(b) * NH + h) * Tn + t] = acc;
}

// dK and dV of one key block.
template <typename In, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dkdv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                               const float* delta, int Tn, int C, int NH, float scale) {
  using L = Ld<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  In* sK = reinterpret_cast<In*>(smem);
  In* sV = reinterpret_cast<In*>(smem + L::tile_bytes);
  In* sQ = reinterpret_cast<In*>(smem + 2 * L::tile_bytes);
  In* sdO = reinterpret_cast<In*>(smem + 3 * L::tile_bytes);
  unsigned char* rest = smem + 4 * L::tile_bytes;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* sS = reinterpret_cast<float*>(rest + warp * L::warp_f32_bytes);
  rest += kFlashWarps * L::warp_f32_bytes;
  float* sT = reinterpret_cast<float*>(rest + warp * L::warp_f32_bytes);
  rest += kFlashWarps * L::warp_f32_bytes;
  In* sP = reinterpret_cast<In*>(rest + warp * L::warp_p_bytes);
  rest += kFlashWarps * L::warp_p_bytes;
  In* sdS = reinterpret_cast<In*>(rest + warp * L::warp_p_bytes);
  rest += kFlashWarps * L::warp_p_bytes;
  float* sLse = reinterpret_cast<float*>(rest);
  float* sD = sLse + kFlashRows;

  // The key blocks with the most query blocks (the first) first.
  const int kb = blockIdx.x, bh = blockIdx.y, nb = gridDim.x;
  const int b = bh / NH, h = bh % NH, C3 = 3 * C, s0 = kb * kFlashRows;
  const float* q = qkv + static_cast<size_t>(b) * Tn * C3 + h * HS;
  const float* dy = dout + static_cast<size_t>(b) * Tn * C + h * HS;
  load_tile<In, HS>(sK, q + C, C3, s0, Tn);
  load_tile<In, HS>(sV, q + 2 * C, C3, s0, Tn);

  constexpr int kHalf = kFlashRows / 2;
  const int r = lane / 2, half = lane % 2;
  const int s = s0 + warp * kWarpRows + r;  // this lane's key
  Acc dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  const In* kw = sK + warp * kWarpRows * L::tile;
  const In* vw = sV + warp * kWarpRows * L::tile;
  for (int qb = kb; qb < nb; ++qb) {
    const int t0 = qb * kFlashRows;
    __syncthreads();  // every warp is done with the last Q, dO, lse and D
    load_tile<In, HS>(sQ, q, C3, t0, Tn);
    load_tile<In, HS>(sdO, dy, C, t0, Tn);
    for (int i = threadIdx.x; i < kFlashRows; i += kFlashThreads) {
      const bool in = t0 + i < Tn;
      sLse[i] = in ? lse[static_cast<size_t>(bh) * Tn + t0 + i] : 0.0f;
      sD[i] = in ? delta[static_cast<size_t>(bh) * Tn + t0 + i] : 0.0f;
    }
    __syncthreads();
    // S^T (16 keys x 64 queries) = K_w Q^T ; dP^T = V_w dO^T
    product_abt<In, HS>(sS, L::f32, kw, L::tile, sQ, L::tile);
    product_abt<In, HS>(sT, L::f32, vw, L::tile, sdO, L::tile);
    __syncwarp();
    // P^T = exp(scale S^T - lse), 0 where the key is past the query (or the
    // query past T); dS^T = P^T (dP^T - D) scale.
    for (int j = 0; j < kHalf; ++j) {
      const int c = half * kHalf + j, t = t0 + c;
      const float p = s <= t && t < Tn ? expf(sS[r * L::f32 + c] * scale - sLse[c]) : 0.0f;
      sP[r * L::p + c] = to_16bit<In>(p);
      sdS[r * L::p + c] = to_16bit<In>(p * (sT[r * L::f32 + c] - sD[c]) * scale);
    }
    __syncwarp();
    // dV += P^T dO ; dK += dS^T Q
    accumulate_ab<In, HS>(dv, sP, L::p, sdO, L::tile);
    accumulate_ab<In, HS>(dk, sdS, L::p, sQ, L::tile);
  }
  float* dkey = dqkv + static_cast<size_t>(b) * Tn * C3 + C + h * HS;
  add_rows<HS>(dkey, C3, s0 + warp * kWarpRows, Tn, dk, sS);
  add_rows<HS>(dkey + C, C3, s0 + warp * kWarpRows, Tn, dv, sS);
}

// dQ of one query block.
template <typename In, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                             const float* delta, int Tn, int C, int NH, float scale) {
  using L = Ld<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  In* sQ = reinterpret_cast<In*>(smem);
  In* sdO = reinterpret_cast<In*>(smem + L::tile_bytes);
  In* sK = reinterpret_cast<In*>(smem + 2 * L::tile_bytes);
  In* sV = reinterpret_cast<In*>(smem + 3 * L::tile_bytes);
  unsigned char* rest = smem + 4 * L::tile_bytes;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* sS = reinterpret_cast<float*>(rest + warp * L::warp_f32_bytes);
  rest += kFlashWarps * L::warp_f32_bytes;
  float* sT = reinterpret_cast<float*>(rest + warp * L::warp_f32_bytes);
  rest += kFlashWarps * L::warp_f32_bytes;
  In* sdS = reinterpret_cast<In*>(rest + warp * L::warp_p_bytes);

  const int qb = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y;
  const int b = bh / NH, h = bh % NH, C3 = 3 * C, t0 = qb * kFlashRows;
  const float* q = qkv + static_cast<size_t>(b) * Tn * C3 + h * HS;
  load_tile<In, HS>(sQ, q, C3, t0, Tn);
  load_tile<In, HS>(sdO, dout + static_cast<size_t>(b) * Tn * C + h * HS, C, t0, Tn);

  constexpr int kHalf = kFlashRows / 2;
  const int r = lane / 2, half = lane % 2;
  const int t = t0 + warp * kWarpRows + r;  // this lane's query
  const float lse_t = t < Tn ? lse[static_cast<size_t>(bh) * Tn + t] : 0.0f;
  const float d_t = t < Tn ? delta[static_cast<size_t>(bh) * Tn + t] : 0.0f;
  Acc dq[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  const In* qw = sQ + warp * kWarpRows * L::tile;
  const In* dow = sdO + warp * kWarpRows * L::tile;
  for (int kb = 0; kb <= qb; ++kb) {
    const int s0 = kb * kFlashRows;
    __syncthreads();  // every warp is done with the last K and V (and sQ, sdO are stored)
    load_tile<In, HS>(sK, q + C, C3, s0, Tn);
    load_tile<In, HS>(sV, q + 2 * C, C3, s0, Tn);
    __syncthreads();
    // S (16 queries x 64 keys) = Q_w K^T ; dP = dO_w V^T
    product_abt<In, HS>(sS, L::f32, qw, L::tile, sK, L::tile);
    product_abt<In, HS>(sT, L::f32, dow, L::tile, sV, L::tile);
    __syncwarp();
    for (int j = 0; j < kHalf; ++j) {
      const int c = half * kHalf + j;
      const float p = s0 + c <= t ? expf(sS[r * L::f32 + c] * scale - lse_t) : 0.0f;
      sdS[r * L::p + c] = to_16bit<In>(p * (sT[r * L::f32 + c] - d_t) * scale);
    }
    __syncwarp();
    accumulate_ab<In, HS>(dq, sdS, L::p, sK, L::tile);  // dQ += dS K
  }
  add_rows<HS>(dqkv + static_cast<size_t>(b) * Tn * C3 + h * HS, C3, t0 + warp * kWarpRows, Tn, dq,
               sS);
}

// ---- launchers ---------------------------------------------------------------

template <int HS>
constexpr size_t forward_smem() {
  using L = Ld<HS>;
  return 3 * L::tile_bytes + kFlashWarps * (L::warp_f32_bytes + L::warp_p_bytes);
}
template <int HS>
constexpr size_t dkdv_smem() {
  using L = Ld<HS>;
  return 4 * L::tile_bytes + kFlashWarps * 2 * (L::warp_f32_bytes + L::warp_p_bytes) +
         2 * kFlashRows * sizeof(float);
}
template <int HS>
constexpr size_t dq_smem() {
  using L = Ld<HS>;
  return 4 * L::tile_bytes + kFlashWarps * (2 * L::warp_f32_bytes + L::warp_p_bytes);
}

// A kernel's dynamic shared memory may pass 48 KiB only once raised, and
// never past the device's opt-in limit (sm_80: 163 KiB, sm_90: 227 KiB; GPUs
// such as sm_86 and sm_89 give 99 KiB, less than head size 128's backward).
template <typename Kernel>
void launch(Kernel kernel, dim3 grid, size_t smem, cudaStream_t stream, const auto&... args) {
  int device = 0, limit = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  MESHLM_CHECK(smem <= static_cast<size_t>(limit),
               "train.attention = flash needs " + std::to_string(smem) +
                   " bytes of shared memory per block at this head size, and GPU " +
                   std::to_string(device) + " gives at most " + std::to_string(limit) +
                   "; use train.attention = probabilities or a smaller head size");
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)));
  kernel<<<grid, kFlashThreads, smem, stream>>>(args...);
  CUDA_CHECK(cudaGetLastError());
}

template <typename In, int HS>
void forward_as(float* out, float* lse, const float* qkv, int B, int Tn, int C, int NH,
                cudaStream_t stream) {
  const dim3 grid((Tn + kFlashRows - 1) / kFlashRows, B * NH);
  launch(flash_forward_kernel<In, HS>, grid, forward_smem<HS>(), stream, out, lse, qkv, Tn, C, NH,
         1.0f / std::sqrt(static_cast<float>(HS)));
}

template <typename In, int HS>
void backward_as(float* dqkv, const float* dout, const float* qkv, const float* lse,
                 const float* delta, int B, int Tn, int C, int NH, cudaStream_t stream) {
  const dim3 grid((Tn + kFlashRows - 1) / kFlashRows, B * NH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  launch(flash_backward_dkdv_kernel<In, HS>, grid, dkdv_smem<HS>(), stream, dqkv, dout, qkv, lse,
         delta, Tn, C, NH, scale);
  launch(flash_backward_dq_kernel<In, HS>, grid, dq_smem<HS>(), stream, dqkv, dout, qkv, lse,
         delta, Tn, C, NH, scale);
}

// fn.template operator()<In, HS>() for the precision's 16-bit type and the
// head size.
template <typename Fn>
void dispatch(ops::Precision p, int HS, Fn&& fn) {
  auto with_type = [&]<typename In>() {
    switch (HS) {
      case 16: fn.template operator()<In, 16>(); return;
      case 32: fn.template operator()<In, 32>(); return;
      case 64: fn.template operator()<In, 64>(); return;
      case 128: fn.template operator()<In, 128>(); return;
    }
  };
  if (p == ops::Precision::bf16)
    with_type.template operator()<__nv_bfloat16>();
  else
    with_type.template operator()<__half>();
}

void check_args(bool ok, const char* op, int B, int Tn, int C, int NH, ops::Precision p) {
  MESHLM_CHECK(ok && B > 0 && Tn > 0 && C > 0 && NH > 0 && C % NH == 0 &&
                   ops::flash_attention_on_gpu(p, C / NH) && static_cast<long long>(B) * NH <= 65535,
               std::string("cuda::") + op + " with B = " + std::to_string(B) + ", T = " +
                   std::to_string(Tn) + ", C = " + std::to_string(C) + ", NH = " +
                   std::to_string(NH) + " at " + std::string(name_of(p)) +
                   " (it needs bf16 or fp16, a head size of 16, 32, 64 or 128, and B NH <= 65535)");
}

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* qkv, int B, int Tn, int C,
                             int NH, cudaStream_t stream, ops::Precision p) {
  check_args(out && lse && qkv, "flash_attention_forward", B, Tn, C, NH, p);
  dispatch(p, C / NH, [&]<typename In, int HS>() {
    forward_as<In, HS>(out, lse, qkv, B, Tn, C, NH, stream);
  });
}

void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* out,
                              const float* qkv, const float* lse, int B, int Tn, int C, int NH,
                              cudaStream_t stream, ops::Precision p) {
  check_args(dqkv && delta && dout && out && qkv && lse, "flash_attention_backward", B, Tn, C, NH,
             p);
  const dim3 dgrid(grid_for_rows(static_cast<long long>(Tn) * NH), B);
  flash_delta_kernel<<<dgrid, kThreads, 0, stream>>>(delta, dout, out, Tn, C, NH);
  CUDA_CHECK(cudaGetLastError());
  dispatch(p, C / NH, [&]<typename In, int HS>() {
    backward_as<In, HS>(dqkv, dout, qkv, lse, delta, B, Tn, C, NH, stream);
  });
}

}  // namespace meshlm::cuda
