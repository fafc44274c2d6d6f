// Attention against a key/value cache on the GPU (cuda/ops_cuda.h), the
// semantics of ops::cached_attention_forward (src/ops/cached_attention.cpp),
// its reference in tests/cuda/test_cuda_ops.cpp. Three kernels on the
// stream: the new keys and values appended to the caches; the scores, a
// warp per (row, head, key); per (row, head) a block that takes the
// softmax over the keys the row sees and its product with V, each sum in a
// fixed order.
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops_cuda.h"

namespace meshlm::cuda {

namespace {

// Rows [p0, p0 + n) of the caches (positions, Ckv) from k and v (rows ldkv apart).
__global__ void append_kv_kernel(float* kc, float* vc, const float* k, const float* v, size_t ldkv,
                                 int n, int p0, int Ckv) {
  const size_t total = size_t(n) * Ckv;
  for (size_t at = size_t(blockIdx.x) * blockDim.x + threadIdx.x; at < total;
       at += size_t(gridDim.x) * blockDim.x) {
    const size_t i = at / Ckv, c = at % Ckv, to = (size_t(p0) + i) * Ckv + c;
    kc[to] = k[i * ldkv + c];
    vc[to] = v[i * ldkv + c];
  }
}

// s(n, NH, keys): scale q_i,h . K_j,h/group for j <= p0 + i (the rest unread).
__global__ void cached_scores_kernel(float* s, const float* q, size_t ldq, const float* kc, int n,
                                     int p0, int NH, int group, int HS, int Ckv, float scale) {
  const int keys = p0 + n;
  const long long w = warp_row(static_cast<long long>(n) * NH * keys);
  if (w < 0) return;
  const int j = static_cast<int>(w % keys);
  const long long ih = w / keys;
  const int h = static_cast<int>(ih % NH), i = static_cast<int>(ih / NH);
  if (j > p0 + i) return;
  const int lane = threadIdx.x % kWarp;
  const float* qr = q + size_t(i) * ldq + size_t(h) * HS;
  const float* kr = kc + size_t(j) * Ckv + size_t(h / group) * HS;
  float acc = 0.0f;
  for (int d = lane; d < HS; d += kWarp) acc += qr[d] * kr[d];
  acc = warp_sum(acc);
  if (lane == 0) s[w] = scale * acc;
}

// Block (i, h): out_i,h = sum_j softmax(s_i,h)_j V_j over j <= p0 + i. The
// exponentials overwrite the scores. Channel d of the product is summed by
// kThreads / HS threads (each every parts-th key), then their partial sums
// in order.
__global__ void cached_softmax_pv_kernel(float* out, float* s, const float* vc, int n, int p0,
                                         int NH, int group, int HS, int Ckv) {
  __shared__ float red[kThreads];
  const int keys = p0 + n, b = blockIdx.x, h = b % NH, i = b / NH, last = p0 + i;
  float* row = s + (size_t(i) * NH + h) * keys;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= last; j += blockDim.x) mx = fmaxf(mx, row[j]);
  mx = block_reduce<true>(mx, red);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= last; j += blockDim.x) {
    const float e = expf(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  sum = block_reduce<false>(sum, red);  // its __syncthreads() also publishes row[]
  __syncthreads();
  const float inv = 1.0f / sum;
  const float* V = vc + size_t(h / group) * HS;
  float* y = out + (size_t(i) * NH + h) * HS;
  if (HS > kThreads) {
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j <= last; ++j) acc += row[j] * V[size_t(j) * Ckv + d];
      y[d] = acc * inv;
    }
    return;
  }
  const int parts = kThreads / HS, d = threadIdx.x % HS, part = threadIdx.x / HS;
  float acc = 0.0f;
  if (part < parts)
    for (int j = part; j <= last; j += parts) acc += row[j] * V[size_t(j) * Ckv + d];
  red[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < HS) {
    float total = 0.0f;
    for (int p = 0; p < parts; ++p) total += red[p * HS + threadIdx.x];
    y[threadIdx.x] = total * inv;
  }
}

}  // namespace

size_t cached_attention_scratch(int n, int keys, int NH) {
  return size_t(n > 0 ? n : 0) * size_t(NH > 0 ? NH : 0) * size_t(keys > 0 ? keys : 0);
}

void cached_attention_forward(float* out, float* kc, float* vc, const float* q, size_t ldq,
                              const float* k, const float* v, size_t ldkv, int n, int p0, int NH,
                              int NKV, int HS, float* scratch, size_t scratch_floats,
                              cudaStream_t stream) {
  MESHLM_CHECK(n >= 1 && p0 >= 0 && NKV >= 1 && NH % NKV == 0 && HS >= 1,
               "cuda::cached_attention_forward with n " + std::to_string(n) + ", p0 " +
                   std::to_string(p0) + ", " + std::to_string(NH) + " heads, " +
                   std::to_string(NKV) + " key/value heads of " + std::to_string(HS));
  const int keys = p0 + n, Ckv = NKV * HS;
  MESHLM_CHECK(scratch_floats >= cached_attention_scratch(n, keys, NH),
               "cuda::cached_attention_forward: scratch too small");
  append_kv_kernel<<<grid_for(size_t(n) * Ckv), kThreads, 0, stream>>>(kc, vc, k, v, ldkv, n, p0,
                                                                        Ckv);
  CUDA_CHECK(cudaGetLastError());
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  const int group = NH / NKV;
  cached_scores_kernel<<<grid_for_rows(static_cast<long long>(n) * NH * keys), kThreads, 0,
                         stream>>>(scratch, q, ldq, kc, n, p0, NH, group, HS, Ckv, scale);
  CUDA_CHECK(cudaGetLastError());
  cached_softmax_pv_kernel<<<static_cast<unsigned>(n) * NH, kThreads, 0, stream>>>(
      out, scratch, vc, n, p0, NH, group, HS, Ckv);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace meshlm::cuda
