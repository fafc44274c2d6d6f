// Llama's ops on the GPU: RMSNorm, rotary position embeddings, SwiGLU and
// grouped-query attention's packing. Each has the semantics of its CPU
// namesake in src/ops/ (rmsnorm.cpp, rope.cpp, swiglu.cpp, gqa.cpp), the
// reference it is tested against (tests/cuda/test_cuda_ops.cpp), in float,
// asynchronous on the given stream. RMSNorm's dw is a sum over rows in a
// fixed order (cuda/scratch.cuh): the same bits every run.
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops_cuda.h"
#include "cuda/scratch.cuh"

namespace meshlm::cuda {

namespace {

void check_launch(bool args_ok, const char* op, long long rows, long long cols) {
  MESHLM_CHECK(args_ok, std::string("cuda::") + op + " with " + std::to_string(rows) + " x " +
                            std::to_string(cols));
}

// Warp per row: out = w (x s), s = 1 / sqrt(mean(x^2) + eps). With kAdd,
// the row is first res = inp + add, written out and read back by the same
// lanes (residual_rmsnorm_forward).
template <bool kAdd>
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* w,
                                       int N, int C, float eps, float* res = nullptr,
                                       const float* add = nullptr) {
  const long long n = warp_row(N);
  if (n < 0) return;
  const int lane = threadIdx.x % kWarp;
  const float* x = inp + size_t(n) * C;
  float ss = 0.0f;
  if constexpr (kAdd) {
    float* r = res + size_t(n) * C;
    ss = add_row(r, x, add + size_t(n) * C, C, [](float v) { return v * v; });
    x = r;
  } else {
    for (int c = lane; c < C; c += kWarp) ss += x[c] * x[c];
  }
  const float s = 1.0f / sqrtf(warp_sum(ss) / C + eps);
  float* o = out + size_t(n) * C;
  for (int c = lane; c < C; c += kWarp) o[c] = w[c] * (x[c] * s);
  if (lane == 0) rstd[n] = s;
}

// dinp += s (g w - xhat mean(g w xhat)), warp per row.
__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                             const float* w, const float* rstd, int N, int C) {
  const long long n = warp_row(N);
  if (n < 0) return;
  const int lane = threadIdx.x % kWarp;
  const float* x = inp + size_t(n) * C;
  const float* g = dout + size_t(n) * C;
  const float s = rstd[n];
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) sum += g[c] * w[c] * (x[c] * s);
  const float mean = warp_sum(sum) / C;
  float* dx = dinp + size_t(n) * C;
  for (int c = lane; c < C; c += kWarp) dx[c] += s * (g[c] * w[c] - (x[c] * s) * mean);
}

// dw's partial sums over a chunk of rows, at partials[k C + c].
__global__ void rmsnorm_dw_partials_kernel(float* partials, const float* dout, const float* inp,
                                           const float* rstd, int N, int C) {
  __shared__ float part[kColumnRows][kWarp];
  const int c = blockIdx.x * kWarp + threadIdx.x % kWarp, r0 = threadIdx.x / kWarp;
  int begin, end;
  chunk_rows(N, begin, end);
  float acc = 0.0f;
  if (c < C)
    for (int n = begin + r0; n < end; n += kColumnRows)
      acc += dout[size_t(n) * C + c] * (inp[size_t(n) * C + c] * rstd[n]);
  acc = column_block_sum(acc, part);
  if (r0 == 0 && c < C) partials[size_t(blockIdx.y) * C + c] = acc;
}

// Thread per (row, head, i < HS/2): the pair (i, i + HS/2) turned by +angle
// (sign 1) or -angle (sign -1).
__global__ void rope_kernel(float* x, const float* cos, const float* sin, long long rows, int Tn,
                            int heads, int HS, size_t ld, float sign) {
  const int half = HS / 2;
  const size_t per_row = size_t(heads) * half;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < size_t(rows) * per_row;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / per_row, rest = i % per_row;
    const int h = static_cast<int>(rest / half), k = static_cast<int>(rest % half);
    const int t = static_cast<int>(r % Tn);
    const float c = cos[size_t(t) * half + k], s = sign * sin[size_t(t) * half + k];
    float* v = x + r * ld + size_t(h) * HS;
    const float a = v[k], b = v[k + half];
    v[k] = a * c - b * s;
    v[k + half] = b * c + a * s;
  }
}

__global__ void swiglu_forward_kernel(float* out, const float* gate, const float* up, int N, int F,
                                      size_t ld) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < size_t(N) * F;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t j = (i / F) * ld + i % F;
    const float g = gate[j];
    out[i] = g / (1.0f + expf(-g)) * up[j];
  }
}

__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout,
                                       const float* gate, const float* up, int N, int F,
                                       size_t ld) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < size_t(N) * F;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t j = (i / F) * ld + i % F;
    const float x = gate[j], d = dout[i], sig = 1.0f / (1.0f + expf(-x));
    dgate[j] = d * up[j] * sig * (1.0f + x * (1.0f - sig));
    dup[j] = d * x * sig;
  }
}

// Thread per element of the packed row (3C of them).
__global__ void gqa_pack_forward_kernel(float* qkv, const float* q, const float* k,
                                        const float* v, int N, int NH, int NKV, int HS,
                                        int q_head0, int group) {
  const size_t C = size_t(NH) * HS, Ckv = size_t(NKV) * HS;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < size_t(N) * 3 * C;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / (3 * C), c = i % (3 * C);
    if (c < C) {
      qkv[i] = q[n * C + c];
    } else {
      const size_t cc = (c - C) % C, h = cc / HS, d = cc % HS;
      const float* src = c < 2 * C ? k : v;
      qkv[i] = src[n * Ckv + ((q_head0 + h) / group) * HS + d];
    }
  }
}

// Thread per element of dq and per element of dk and dv (the sum over the
// query heads that read it, in order).
__global__ void gqa_pack_backward_kernel(float* dq, float* dk, float* dv, const float* dqkv, int N,
                                         int NH, int NKV, int HS, int q_head0, int group) {
  const size_t C = size_t(NH) * HS, Ckv = size_t(NKV) * HS;
  const size_t per_row = C + 2 * Ckv;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < size_t(N) * per_row;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / per_row, c = i % per_row;
    const float* row = dqkv + n * 3 * C;
    if (c < C) {
      dq[n * C + c] = row[c];
      continue;
    }
    const bool is_k = c < C + Ckv;
    const size_t cc = c - C - (is_k ? 0 : Ckv), g = cc / HS, d = cc % HS;
    const float* part = row + (is_k ? C : 2 * C);
    float s = 0.0f;
    const long long h0 = max(0LL, (long long)g * group - q_head0),
                    h1 = min((long long)NH, (long long)(g + 1) * group - q_head0);
    for (long long h = h0; h < h1; ++h) s += part[size_t(h) * HS + d];
    (is_k ? dk : dv)[n * Ckv + cc] = s;
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                     double eps, cudaStream_t stream) {
  if (N == 0) return;
  check_launch(out && rstd && inp && w && N > 0 && C > 0, "rmsnorm_forward", N, C);
  rmsnorm_forward_kernel<false><<<grid_for_rows(N), kThreads, 0, stream>>>(
      out, rstd, inp, w, N, C, static_cast<float>(eps));
  CUDA_CHECK(cudaGetLastError());
}

void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b,
                              const float* w, int N, int C, double eps, cudaStream_t stream) {
  if (N == 0) return;
  check_launch(res && out && rstd && a && b && w && N > 0 && C > 0, "residual_rmsnorm_forward", N,
               C);
  rmsnorm_forward_kernel<true><<<grid_for_rows(N), kThreads, 0, stream>>>(
      out, rstd, a, w, N, C, static_cast<float>(eps), res, b);
  CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  check_launch(dinp && dout && inp && w && rstd && N > 0 && C > 0, "rmsnorm_backward", N, C);
  rmsnorm_backward_dinp_kernel<<<grid_for_rows(N), kThreads, 0, stream>>>(dinp, dout, inp, w,
                                                                          rstd, N, C);
  CUDA_CHECK(cudaGetLastError());
  if (dw == nullptr) return;  // a frozen gain
  const dim3 grid = column_partials_grid(N, C);
  const int chunks = static_cast<int>(grid.y);
  float* partials = column_partials(stream, size_t(chunks) * C);
  rmsnorm_dw_partials_kernel<<<grid, kThreads, 0, stream>>>(partials, dout, inp, rstd, N, C);
  CUDA_CHECK(cudaGetLastError());
  add_column_partials(dw, partials, chunks, C, stream);
}

void rope_forward(float* x, const float* cos, const float* sin, int B, int Tn, int heads, int HS,
                  size_t ld, cudaStream_t stream) {
  const long long rows = static_cast<long long>(B) * Tn;
  if (rows == 0 || heads == 0) return;
  check_launch(x && cos && sin && HS % 2 == 0 && ld >= size_t(heads) * HS, "rope_forward", rows,
               static_cast<long long>(heads) * HS);
  rope_kernel<<<grid_for(size_t(rows) * heads * (HS / 2)), kThreads, 0, stream>>>(
      x, cos, sin, rows, Tn, heads, HS, ld, 1.0f);
  CUDA_CHECK(cudaGetLastError());
}

void rope_backward(float* dx, const float* cos, const float* sin, int B, int Tn, int heads, int HS,
                   size_t ld, cudaStream_t stream) {
  const long long rows = static_cast<long long>(B) * Tn;
  if (rows == 0 || heads == 0) return;
  check_launch(dx && cos && sin && HS % 2 == 0 && ld >= size_t(heads) * HS, "rope_backward",
               rows, static_cast<long long>(heads) * HS);
  rope_kernel<<<grid_for(size_t(rows) * heads * (HS / 2)), kThreads, 0, stream>>>(
      dx, cos, sin, rows, Tn, heads, HS, ld, -1.0f);
  CUDA_CHECK(cudaGetLastError());
}

void swiglu_forward(float* out, const float* gate, const float* up, int N, int F, size_t ld,
                    cudaStream_t stream) {
  if (size_t(N) * F == 0) return;
  check_launch(out && gate && up && ld >= size_t(F), "swiglu_forward", N, F);
  swiglu_forward_kernel<<<grid_for(size_t(N) * F), kThreads, 0, stream>>>(out, gate, up, N, F, ld);
  CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int N, int F, size_t ld, cudaStream_t stream) {
  if (size_t(N) * F == 0) return;
  check_launch(dgate && dup && dout && gate && up && ld >= size_t(F), "swiglu_backward", N, F);
  swiglu_backward_kernel<<<grid_for(size_t(N) * F), kThreads, 0, stream>>>(dgate, dup, dout, gate,
                                                                           up, N, F, ld);
  CUDA_CHECK(cudaGetLastError());
}

// The group of `m` (0: NH / NKV), checked: every query head reads a held head.
static int gqa_group(int NH, int NKV, ops::GqaMap m, const char* what, int N) {
  const int group = m.group > 0 ? m.group : (NKV > 0 ? NH / NKV : 0);
  check_launch(NKV > 0 && group > 0 && m.q_head0 >= 0 && (m.q_head0 + NH - 1) / group < NKV, what,
               N, 3LL * NH);
  return group;
}

void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int N, int NH,
                      int NKV, int HS, ops::GqaMap m, cudaStream_t stream) {
  if (N == 0) return;
  const int group = gqa_group(NH, NKV, m, "gqa_pack_forward", N);
  check_launch(qkv && q && k && v && HS > 0, "gqa_pack_forward", N, 3LL * NH * HS);
  gqa_pack_forward_kernel<<<grid_for(size_t(N) * 3 * NH * HS), kThreads, 0, stream>>>(
      qkv, q, k, v, N, NH, NKV, HS, m.q_head0, group);
  CUDA_CHECK(cudaGetLastError());
}

void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int N, int NH, int NKV,
                       int HS, ops::GqaMap m, cudaStream_t stream) {
  if (N == 0) return;
  const int group = gqa_group(NH, NKV, m, "gqa_pack_backward", N);
  check_launch(dq && dk && dv && dqkv && HS > 0, "gqa_pack_backward", N, 3LL * NH * HS);
  gqa_pack_backward_kernel<<<grid_for(size_t(N) * (NH + 2 * NKV) * HS), kThreads, 0, stream>>>(
      dq, dk, dv, dqkv, N, NH, NKV, HS, m.q_head0, group);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace meshlm::cuda
