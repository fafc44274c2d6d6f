// Causal self-attention fused into one kernel for the forward and two for the
// backward (train.attention = flash), with the tiles multiplied on the tensor
// cores (mma.sync m16n8k16, fp32 accumulation). The reference is
// ops::flash_attention_* on the CPU (the same function and the same kept
// log-sum-exp); the strided-batched version of attention.cu computes the same
// output from the probabilities.
//
// Inputs: qkv (and dout in the backward) are rounded to the precision's
// 16-bit type once per call, into the stream's buffer of 16-bit GEMM inputs
// (cuda/blas.cuh), as the reference's GEMMs round them; the tiles then travel
// to shared memory by cp.async, the next tile's copy in flight while the
// current one is multiplied (two buffers). The scores, the softmax, the
// log-sum-exp and every accumulator are fp32 and stay in registers: the
// accumulator fragment of S = Q K^T is, element for element, the operand
// fragment of P V (FlashAttention-2's layout), so P never goes to memory.
//
// Tiles: a block of kFlashThreads (4 warps) takes 64 rows (queries, or keys
// in dK/dV) of one (batch row, head) pair; each warp owns 16 of them and
// multiplies them by 64-row tiles of the other operand.
//
//   forward, per query block: for each key block up to the diagonal,
//     S = Q K^T (16 x 64 per warp), online softmax in base 2 (running max m
//     and sum l per row; P = 2^(S scale log2e - m) rounded to 16 bits for
//     the product, summed unrounded), O = alpha O + P V.
//     Then out = O / l and lse = (m + log2 l) ln 2.
//   dK, dV, per key block: for each query block from the diagonal on,
//     P^T = exp(scale K Q^T - lse), dV += P^T dO, dP^T = V dO^T,
//     dS^T = P^T (dP^T - D) scale, dK += dS^T Q.
//   dQ, per query block: for each key block up to the diagonal,
//     the same P and dS, dQ += dS K.
//   D = rowsum(dO * O) first, one warp per row (the delta scratch).
// Every output element is written (stored, not added: dqkv is overwritten) by
// one thread in a fixed order: no atomics, the same bits every run. Rows past T are zeros in shared memory and never
// written back.
//
// Fragments (PTX ISA, mma.m16n8k16 with 16-bit operands): lane l holds, of a
// 16 x 8 accumulator, rows g = l / 4 and g + 8 at columns 2 (l % 4) and
// 2 (l % 4) + 1 (c0 c1 for row g, c2 c3 for row g + 8); of a 16 x 16 A
// operand, the same rows at those columns and those plus 8 (a0: row g, a1:
// row g + 8, a2: row g cols + 8, a3: row g + 8 cols + 8); of a 16 x 8 B
// operand, rows (k) 2 (l % 4) and + 1 of column g (b0), and those plus 8 (b1).
// ldmatrix.x4 gives four 8 x 8 matrices whose rows lanes 8i..8i+7 address;
// with .trans each lane receives the transposed pairs (a B operand from a
// row-major K x N tile).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "cuda/blas.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/launch.cuh"
#include "cuda/pack16.cuh"
#include "cuda/ops_cuda.h"

namespace meshlm::cuda {

namespace {

constexpr int kFlashRows = 64;  // rows of a block's tile (queries or keys)
constexpr int kWarpRows = 16;   // rows of a warp: one MMA tile high
constexpr int kFlashWarps = kFlashRows / kWarpRows;
constexpr int kFlashThreads = kFlashWarps * kWarp;
constexpr int kNTiles = kFlashRows / 8;  // 8-column accumulator tiles across a 64-row tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared tiles: 64 rows of HS 16-bit elements, each row padded by 16 bytes so
// that the 8 rows an ldmatrix reads fall in distinct banks.
template <int HS>
struct Tile {
  static constexpr int ld = HS + 8;
  static constexpr int elems = kFlashRows * ld;
  static constexpr size_t bytes = size_t(elems) * 2;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d(16 x 8) += a(16 x 16) b(16 x 8), fp32 accumulation.
template <typename In>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                   uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes from global to shared memory, asynchronously; src_bytes = 0
// writes zeros (the address is not read then, but must be valid).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows [r0, r0 + 64) of a (T, HS) 16-bit matrix whose rows are ld elements
// apart into a shared tile, queued by cp.async; rows past T are zeros.
template <int HS, typename In>
__device__ __forceinline__ void load_tile_async(In* dst, const In* src, int ld, int r0, int Tn) {
  constexpr int kChunks = HS / 8;  // 16-byte pieces of a row
  for (int i = threadIdx.x; i < kFlashRows * kChunks; i += kFlashThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8, t = r0 + r;
    const bool in = t < Tn;
    cp_async16(dst + r * Tile<HS>::ld + c, src + static_cast<size_t>(in ? t : 0) * ld + c,
               in ? 16 : 0);
  }
}

// Key block kb's K and V tiles (buffer kb % 2) ready for every warp: block
// kb + 1's queued first into the other buffer when kb < last, so that its
// copy runs during block kb's products. Every thread of the block calls it.
template <int HS, typename In>
__device__ __forceinline__ void next_kv(In* sK, In* sV, const In* k, const In* v, int ld, int kb,
                                        int last, int Tn) {
  if (kb < last) {
    const int nb = (kb + 1) % 2;
    load_tile_async<HS>(sK + nb * Tile<HS>::elems, k, ld, (kb + 1) * kFlashRows, Tn);
    load_tile_async<HS>(sV + nb * Tile<HS>::elems, v, ld, (kb + 1) * kFlashRows, Tn);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// The operand of the warp's 16 rows starting at `rows`, columns [k0, k0 + 16):
// an A fragment (ldmatrix.x4: rows 0-7 and 8-15 of columns k0, then k0 + 8).
template <int HS, typename In>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const In* tile, int rows, int k0) {
  const int lane = threadIdx.x % kWarp;
  ldmatrix_x4(a, tile + (rows + lane % 8 + ((lane / 8) % 2) * 8) * Tile<HS>::ld + k0 +
                     (lane / 16) * 8);
}
// B fragments of two 8-column tiles of X^T, X row-major (its rows are the
// columns n0..n0 + 15 of the product, k0..k0 + 15 its reduction index):
// b[0], b[1] for columns n0..n0 + 7, b[2], b[3] for n0 + 8..n0 + 15.
template <int HS, typename In>
__device__ __forceinline__ void load_bt(uint32_t (&b)[4], const In* tile, int n0, int k0) {
  const int lane = threadIdx.x % kWarp;
  ldmatrix_x4(b, tile + (n0 + lane % 8 + (lane / 16) * 8) * Tile<HS>::ld + k0 +
                     ((lane / 8) % 2) * 8);
}
// B fragments of two 8-column tiles of X itself, X row-major (rows k0..k0 +
// 15 the reduction index, columns n0..n0 + 15): b[0], b[1] for columns
// n0..n0 + 7, b[2], b[3] for n0 + 8..n0 + 15.
template <int HS, typename In>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const In* tile, int k0, int n0) {
  const int lane = threadIdx.x % kWarp;
  ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * Tile<HS>::ld + n0 +
                           (lane / 16) * 8);
}

// acc(16 x 64) = A(16 x HS, the warp's rows of `a`) B(64 rows of `b`)^T.
template <int HS, typename In>
__device__ __forceinline__ void product_abt(float (&acc)[kNTiles][4], const In* a, int rows,
                                            const In* b) {
#pragma unroll
  for (int n = 0; n < kNTiles; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
#pragma unroll
  for (int k0 = 0; k0 < HS; k0 += 16) {
    uint32_t fa[4];
    load_a<HS>(fa, a, rows, k0);
#pragma unroll
    for (int n0 = 0; n0 < kFlashRows; n0 += 16) {
      uint32_t fb[4];
      load_bt<HS>(fb, b, n0, k0);
      mma<In>(acc[n0 / 8], fa, fb[0], fb[1]);
      mma<In>(acc[n0 / 8 + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc(16 x HS) += P(16 x 64, as A fragments from registers) X(64 rows of `x`).
template <int HS, typename In>
__device__ __forceinline__ void accumulate_px(float (&acc)[HS / 8][4],
                                              const uint32_t (&p)[kFlashRows / 16][4],
                                              const In* x) {
#pragma unroll
  for (int c = 0; c < kFlashRows / 16; ++c)
#pragma unroll
    for (int n0 = 0; n0 < HS; n0 += 16) {
      uint32_t fb[4];
      load_b<HS>(fb, x, c * 16, n0);
      mma<In>(acc[n0 / 8], p[c], fb[0], fb[1]);
      mma<In>(acc[n0 / 8 + 1], p[c], fb[2], fb[3]);
    }
}

// Accumulator tile n's two columns of the lane (c0 c1, and c2 c3 for the
// row 8 below) as the A operand of the next product: chunk n / 2, registers
// 0-1 (even n) or 2-3 (odd n).
template <typename In>
__device__ __forceinline__ void to_operand(uint32_t (&p)[kFlashRows / 16][4], int n, float c0,
                                           float c1, float c2, float c3) {
  p[n / 2][(n % 2) * 2] = pack_16bit<In>(c0, c1);
  p[n / 2][(n % 2) * 2 + 1] = pack_16bit<In>(c2, c3);
}

// dst rows [r, r + 8) ... of a matrix with rows ld floats apart = the lane's
// accumulator values (dqkv is overwritten, ops/ops.h): rows r_lo and
// r_lo + 8 of the warp (skipped at or past T), columns 8n + 2 (lane % 4) and + 1.
template <int HS>
__device__ __forceinline__ void store_rows(float* dst, int ld, int r_lo, int Tn,
                                           const float (&acc)[HS / 8][4]) {
  const int col = (threadIdx.x % 4) * 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r_lo + half * 8;
    if (r >= Tn) continue;
    float* row = dst + static_cast<size_t>(r) * ld + col;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      *reinterpret_cast<float2*>(row + n * 8) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
    }
  }
}

template <typename In, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(float* out, float* lse, const In* qkv, int Tn, int C, int NH,
                         float scale_log2) {
  using L = Tile<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  In* sQ = reinterpret_cast<In*>(smem);
  In* sK = sQ + L::elems;      // two buffers
  In* sV = sK + 2 * L::elems;  // two buffers
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

  // The longest query blocks (most keys) first.
  const int qb = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y;
  const int b = bh / NH, h = bh % NH, C3 = 3 * C, t0 = qb * kFlashRows;
  const In* q = qkv + static_cast<size_t>(b) * Tn * C3 + h * HS;
  const In* k = q + C;
  const In* v = q + 2 * C;
  load_tile_async<HS>(sQ, q, C3, t0, Tn);
  load_tile_async<HS>(sK, k, C3, 0, Tn);
  load_tile_async<HS>(sV, v, C3, 0, Tn);
  cp_async_commit();

  const int row0 = warp * kWarpRows;
  const int t_lo = t0 + row0 + lane / 4;  // the lane's queries: t_lo and t_lo + 8
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[HS / 8][4];
#pragma unroll
  for (int n = 0; n < HS / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[n][i] = 0.0f;

  for (int kb = 0; kb <= qb; ++kb) {
    next_kv<HS>(sK, sV, k, v, C3, kb, qb, Tn);
    const In* cK = sK + (kb % 2) * L::elems;
    const In* cV = sV + (kb % 2) * L::elems;
    float s[kNTiles][4];
    product_abt<HS, In>(s, sQ, row0, cK);

    // Scores in base 2; key s0 + col is masked past the query on the diagonal.
    const int s0 = kb * kFlashRows, cl = (lane % 4) * 2;
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < kNTiles; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = s0 + n * 8 + cl + (i & 1), t = t_lo + (i / 2) * 8;
        const float x = (kb == qb && key > t) ? -INFINITY : s[n][i] * scale_log2;
        s[n][i] = x;
        mx[i / 2] = fmaxf(mx[i / 2], x);
      }
    uint32_t p[kFlashRows / 16][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
      // Key 0 is in the first block and every query sees it: mx is finite.
      const float alpha = exp2f(m[j] - mx[j]);
      m[j] = mx[j];
      l[j] *= alpha;
#pragma unroll
      for (int n = 0; n < HS / 8; ++n) {
        o[n][2 * j] *= alpha;
        o[n][2 * j + 1] *= alpha;
      }
    }
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const float p0 = exp2f(s[n][0] - m[0]), p1 = exp2f(s[n][1] - m[0]);
      const float p2 = exp2f(s[n][2] - m[1]), p3 = exp2f(s[n][3] - m[1]);
      l[0] += p0 + p1;
      l[1] += p2 + p3;
      to_operand<In>(p, n, p0, p1, p2, p3);
    }
    accumulate_px<HS, In>(o, p, cV);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 1);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 2);
  }
  const int col = (lane % 4) * 2;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int t = t_lo + j * 8;
    if (t >= Tn) continue;
    const float inv = 1.0f / l[j];
    float* y = out + (static_cast<size_t>(b) * Tn + t) * C + h * HS + col;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n)
      *reinterpret_cast<float2*>(y + n * 8) = make_float2(o[n][2 * j] * inv, o[n][2 * j + 1] * inv);
    if (lane % 4 == 0) lse[static_cast<size_t>(bh) * Tn + t] = (m[j] + log2f(l[j])) * kLn2;
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

// lse(b,h,t) log2e and D(b,h,t) of the 64 queries from t0 into shared
// memory (zeros past T), read by every warp after the next __syncthreads().
__device__ __forceinline__ void load_row_stats(float* sL, float* sD, const float* lse,
                                               const float* delta, size_t bh_off, int t0, int Tn) {
  for (int i = threadIdx.x; i < kFlashRows; i += kFlashThreads) {
    const bool in = t0 + i < Tn;
    sL[i] = in ? lse[bh_off + t0 + i] * kLog2e : 0.0f;
    sD[i] = in ? delta[bh_off + t0 + i] : 0.0f;
  }
}

// dK and dV of one key block: S^T and dP^T with the block's keys as rows, so
// that P^T and dS^T are the A operands of dV += P^T dO and dK += dS^T Q.
template <typename In, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dkdv_kernel(float* dqkv, const In* dout, const In* qkv, const float* lse,
                               const float* delta, int Tn, int C, int NH, float scale,
                               float scale_log2) {
  using L = Tile<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  In* sK = reinterpret_cast<In*>(smem);
  In* sV = sK + L::elems;
  In* sQ = sV + L::elems;       // two buffers
  In* sdO = sQ + 2 * L::elems;  // two buffers
  float* sL = reinterpret_cast<float*>(sdO + 2 * L::elems);  // two buffers of 64
  float* sD = sL + 2 * kFlashRows;                            // two buffers of 64
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

  // The key blocks with the most query blocks (the first) first.
  const int kb = blockIdx.x, bh = blockIdx.y, nb = gridDim.x;
  const int b = bh / NH, h = bh % NH, C3 = 3 * C, s0 = kb * kFlashRows;
  const size_t bh_off = static_cast<size_t>(bh) * Tn;
  const In* q = qkv + static_cast<size_t>(b) * Tn * C3 + h * HS;
  const In* dy = dout + static_cast<size_t>(b) * Tn * C + h * HS;
  load_tile_async<HS>(sK, q + C, C3, s0, Tn);
  load_tile_async<HS>(sV, q + 2 * C, C3, s0, Tn);
  load_tile_async<HS>(sQ, q, C3, s0, Tn);
  load_tile_async<HS>(sdO, dy, C, s0, Tn);
  cp_async_commit();
  load_row_stats(sL, sD, lse, delta, bh_off, s0, Tn);

  const int row0 = warp * kWarpRows;
  const int key_lo = s0 + row0 + lane / 4;  // the lane's keys: key_lo and key_lo + 8
  float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
  for (int n = 0; n < HS / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[n][i] = dv[n][i] = 0.0f;

  for (int qb = kb; qb < nb; ++qb) {
    const int buf = (qb - kb) % 2;
    if (qb + 1 < nb) {
      const int nbuf = 1 - buf, t1 = (qb + 1) * kFlashRows;
      load_tile_async<HS>(sQ + nbuf * L::elems, q, C3, t1, Tn);
      load_tile_async<HS>(sdO + nbuf * L::elems, dy, C, t1, Tn);
      cp_async_commit();
      load_row_stats(sL + nbuf * kFlashRows, sD + nbuf * kFlashRows, lse, delta, bh_off, t1, Tn);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const In* cQ = sQ + buf * L::elems;
    const In* cdO = sdO + buf * L::elems;
    const float* cL = sL + buf * kFlashRows;
    const float* cD = sD + buf * kFlashRows;
    // S^T (16 keys x 64 queries) = K_w Q^T ; dP^T = V_w dO^T
    float st[kNTiles][4], dpt[kNTiles][4];
    product_abt<HS, In>(st, sK, row0, cQ);
    product_abt<HS, In>(dpt, sV, row0, cdO);
    // P^T = exp(scale S^T - lse), 0 where the key is past the query (or the
    // query past T); dS^T = P^T (dP^T - D) scale.
    const int t0 = qb * kFlashRows;
    uint32_t pt[kFlashRows / 16][4], dst[kFlashRows / 16][4];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      float pv[4], dsv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = n * 8 + (lane % 4) * 2 + (i & 1), t = t0 + c, key = key_lo + (i / 2) * 8;
        const float pe = key <= t && t < Tn ? exp2f(st[n][i] * scale_log2 - cL[c]) : 0.0f;
        pv[i] = pe;
        dsv[i] = pe * (dpt[n][i] - cD[c]) * scale;
      }
      to_operand<In>(pt, n, pv[0], pv[1], pv[2], pv[3]);
      to_operand<In>(dst, n, dsv[0], dsv[1], dsv[2], dsv[3]);
    }
    // dV += P^T dO ; dK += dS^T Q
    accumulate_px<HS, In>(dv, pt, cdO);
    accumulate_px<HS, In>(dk, dst, cQ);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  float* dkey = dqkv + static_cast<size_t>(b) * Tn * C3 + C + h * HS;
  store_rows<HS>(dkey, C3, key_lo, Tn, dk);
  store_rows<HS>(dkey + C, C3, key_lo, Tn, dv);
}

// dQ of one query block.
template <typename In, int HS>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dq_kernel(float* dqkv, const In* dout, const In* qkv, const float* lse,
                             const float* delta, int Tn, int C, int NH, float scale,
                             float scale_log2) {
  using L = Tile<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  In* sQ = reinterpret_cast<In*>(smem);
  In* sdO = sQ + L::elems;
  In* sK = sdO + L::elems;     // two buffers
  In* sV = sK + 2 * L::elems;  // two buffers
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

  const int qb = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y;
  const int b = bh / NH, h = bh % NH, C3 = 3 * C, t0 = qb * kFlashRows;
  const In* q = qkv + static_cast<size_t>(b) * Tn * C3 + h * HS;
  const In* k = q + C;
  const In* v = q + 2 * C;
  load_tile_async<HS>(sQ, q, C3, t0, Tn);
  load_tile_async<HS>(sdO, dout + static_cast<size_t>(b) * Tn * C + h * HS, C, t0, Tn);
  load_tile_async<HS>(sK, k, C3, 0, Tn);
  load_tile_async<HS>(sV, v, C3, 0, Tn);
  cp_async_commit();

  const int row0 = warp * kWarpRows;
  const int t_lo = t0 + row0 + lane / 4;  // the lane's queries: t_lo and t_lo + 8
  float lse2[2], d[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int t = t_lo + j * 8;
    lse2[j] = t < Tn ? lse[static_cast<size_t>(bh) * Tn + t] * kLog2e : 0.0f;
    d[j] = t < Tn ? delta[static_cast<size_t>(bh) * Tn + t] : 0.0f;
  }
  float dq[HS / 8][4];
#pragma unroll
  for (int n = 0; n < HS / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) dq[n][i] = 0.0f;

  for (int kb = 0; kb <= qb; ++kb) {
    next_kv<HS>(sK, sV, k, v, C3, kb, qb, Tn);
    const In* cK = sK + (kb % 2) * L::elems;
    const In* cV = sV + (kb % 2) * L::elems;
    // S (16 queries x 64 keys) = Q_w K^T ; dP = dO_w V^T
    float sc[kNTiles][4], dp[kNTiles][4];
    product_abt<HS, In>(sc, sQ, row0, cK);
    product_abt<HS, In>(dp, sdO, row0, cV);
    const int s0 = kb * kFlashRows;
    uint32_t ds[kFlashRows / 16][4];
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      float dsv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = s0 + n * 8 + (lane % 4) * 2 + (i & 1), j = i / 2;
        const float pe = key <= t_lo + j * 8 ? exp2f(sc[n][i] * scale_log2 - lse2[j]) : 0.0f;
        dsv[i] = pe * (dp[n][i] - d[j]) * scale;
      }
      to_operand<In>(ds, n, dsv[0], dsv[1], dsv[2], dsv[3]);
    }
    accumulate_px<HS, In>(dq, ds, cK);  // dQ += dS K
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  store_rows<HS>(dqkv + static_cast<size_t>(b) * Tn * C3 + h * HS, C3, t_lo, Tn, dq);
}

// ---- launchers ---------------------------------------------------------------

template <int HS>
constexpr size_t forward_smem() {
  return 5 * Tile<HS>::bytes;  // Q, two K, two V
}
template <int HS>
constexpr size_t dkdv_smem() {
  return 6 * Tile<HS>::bytes + 4 * kFlashRows * sizeof(float);  // K, V, two Q, two dO, lse, D
}
template <int HS>
constexpr size_t dq_smem() {
  return 6 * Tile<HS>::bytes;  // Q, dO, two K, two V
}

// A kernel's dynamic shared memory may pass 48 KiB only once raised, and
// never past the device's opt-in limit (sm_80: 163 KiB, sm_90: 227 KiB; GPUs
// such as sm_86 and sm_89 give 99 KiB, more than head size 128's 96 KiB).
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

template <typename In>
constexpr ops::Precision precision_of() {
  return std::is_same_v<In, __nv_bfloat16> ? ops::Precision::bf16 : ops::Precision::fp16;
}

template <typename In, int HS>
void forward_as(float* out, float* lse, const float* qkv, int B, int Tn, int C, int NH,
                cudaStream_t stream) {
  const size_t n = size_t(B) * Tn * 3 * C;
  In* qkv16 = static_cast<In*>(inputs_16bit(stream, n, 0)[0]);
  round_span(precision_of<In>(), qkv16, qkv, n, stream);
  const dim3 grid((Tn + kFlashRows - 1) / kFlashRows, B * NH);
  launch(flash_forward_kernel<In, HS>, grid, forward_smem<HS>(), stream, out, lse,
         static_cast<const In*>(qkv16), Tn, C, NH,
         kLog2e / std::sqrt(static_cast<float>(HS)));
}

template <typename In, int HS>
void backward_as(float* dqkv, const float* dout, const float* qkv, const float* lse,
                 const float* delta, int B, int Tn, int C, int NH, cudaStream_t stream) {
  const size_t n = size_t(B) * Tn * 3 * C, nd = size_t(B) * Tn * C;
  const auto copies = inputs_16bit(stream, n, nd);
  In* qkv16 = static_cast<In*>(copies[0]);
  In* dout16 = static_cast<In*>(copies[1]);
  round_span(precision_of<In>(), qkv16, qkv, n, stream);
  round_span(precision_of<In>(), dout16, dout, nd, stream);
  const dim3 grid((Tn + kFlashRows - 1) / kFlashRows, B * NH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS)), scale_log2 = scale * kLog2e;
  launch(flash_backward_dkdv_kernel<In, HS>, grid, dkdv_smem<HS>(), stream, dqkv,
         static_cast<const In*>(dout16), static_cast<const In*>(qkv16), lse, delta, Tn, C, NH,
         scale, scale_log2);
  launch(flash_backward_dq_kernel<In, HS>, grid, dq_smem<HS>(), stream, dqkv,
         static_cast<const In*>(dout16), static_cast<const In*>(qkv16), lse, delta, Tn, C, NH,
         scale, scale_log2);
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
