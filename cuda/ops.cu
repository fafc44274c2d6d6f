// The row and elementwise ops of the ops interface on the GPU: embeddings,
// layer norm, residual and the vocabulary-parallel cross-entropy. Each has
// the semantics of its CPU namesake in src/ops/ (the reference it is tested
// against, tests/cuda/test_cuda_ops.cpp), in float, asynchronous on the
// given stream.
//
// Sums over rows (dwte, dwpe, LayerNorm's dw and db) run in a fixed order
// with no atomics, so a step gives the same bits every time; a row kernel
// gives each row to one warp (C, the channels) or one block (Vl, the
// vocabulary columns).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops_cuda.h"
#include "cuda/scratch.cuh"

namespace meshlm::cuda {

namespace {

constexpr float kLayerNormEps = 1e-5f;

// Grid-stride loop over [0, n).
#define MESHLM_FOR_EACH(i, n)                                                        \
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < size_t(n); \
       i += size_t(gridDim.x) * blockDim.x)

void check_launch(bool args_ok, const char* op, const std::string& sizes) {
  MESHLM_CHECK(args_ok, std::string("cuda::") + op + " with " + sizes);
}

// ---------------------------------------------------------------------------
// embeddings
// ---------------------------------------------------------------------------

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte_part,
                                         int N, int C, int v0, int Vl) {
  MESHLM_FOR_EACH(i, size_t(N) * C) {
    const size_t n = i / C, c = i % C;
    const int row = tokens[n] - v0;
    out[i] = (row >= 0 && row < Vl) ? wte_part[size_t(row) * C + c] : 0.0f;
  }
}

// Block (u, channel block): row rows[u] of dwte_part, which the positions
// order[starts[u]], ..., order[starts[u + 1] - 1] (increasing) hold, adds
// their gradients one after the other: the additions of the CPU op, in its
// order, and every row at once.
__global__ void embedding_backward_kernel(float* dwte_part, const float* dout, const int32_t* rows,
                                          const int32_t* starts, const int32_t* order, int C) {
  const int u = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* te = dwte_part + size_t(rows[u]) * C + c;
  float acc = *te;
  for (int i = starts[u]; i < starts[u + 1]; ++i) acc += dout[size_t(order[i]) * C + c];
  *te = acc;
}

__global__ void position_forward_kernel(float* out, const float* wpe, int B, int Tn, int C) {
  MESHLM_FOR_EACH(i, size_t(B) * Tn * C) out[i] += wpe[i % (size_t(Tn) * C)];
}

// Thread per (t, c): the sum over the batch, in order b = 0, 1, ...
__global__ void position_backward_kernel(float* dwpe, const float* dout, int B, int Tn, int C) {
  const size_t TC = size_t(Tn) * C;
  MESHLM_FOR_EACH(i, TC) {
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += dout[size_t(b) * TC + i];
    dwpe[i] += acc;
  }
}

// ---------------------------------------------------------------------------
// layer norm
// ---------------------------------------------------------------------------

// Warp per row, two passes over the row as the CPU op (mean, then variance
// of the differences). With kAdd, the row is first res = a + b (inp = a),
// written out and read back by the same lanes (residual_layernorm_forward).
template <bool kAdd>
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int N, int C,
                                         float* res = nullptr, const float* add = nullptr) {
  const long long n = warp_row(N);
  if (n < 0) return;
  const int lane = threadIdx.x % kWarp;
  const float* x = inp + size_t(n) * C;
  float sum = 0.0f;
  if constexpr (kAdd) {
    float* r = res + size_t(n) * C;
    sum = add_row(r, x, add + size_t(n) * C, C, [](float v) { return v; });
    x = r;
  } else {
    for (int c = lane; c < C; c += kWarp) sum += x[c];
  }
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float d = x[c] - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(warp_sum(var) / C + kLayerNormEps);
  float* o = out + size_t(n) * C;
  for (int c = lane; c < C; c += kWarp) o[c] = (x[c] - m) * s * w[c] + b[c];
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

// dinp, warp per row: dx = s (dxhat - mean(dxhat) - xhat mean(dxhat xhat)).
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                               const float* w, const float* mean,
                                               const float* rstd, int N, int C) {
  const long long n = warp_row(N);
  if (n < 0) return;
  const int lane = threadIdx.x % kWarp;
  const float* x = inp + size_t(n) * C;
  const float* g = dout + size_t(n) * C;
  const float m = mean[n], s = rstd[n];
  float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float dxhat = g[c] * w[c];
    sum_dxhat += dxhat;
    sum_dxhat_xhat += dxhat * (x[c] - m) * s;
  }
  const float mean_dxhat = warp_sum(sum_dxhat) / C;
  const float mean_dxhat_xhat = warp_sum(sum_dxhat_xhat) / C;
  float* dx = dinp + size_t(n) * C;
  for (int c = lane; c < C; c += kWarp) {
    const float xhat = (x[c] - m) * s;
    dx[c] += s * (g[c] * w[c] - mean_dxhat - xhat * mean_dxhat_xhat);
  }
}

// The partial sums of dw and db over a chunk of rows (cuda/scratch.cuh;
// column_block_sum within the block of 32 channels): dw's at partials[k C + c],
// db's `chunks` C further.
__global__ void layernorm_dwdb_partials_kernel(float* partials, const float* dout,
                                               const float* inp, const float* mean,
                                               const float* rstd, int N, int C) {
  __shared__ float part[kColumnRows][kWarp];
  const int c = blockIdx.x * kWarp + threadIdx.x % kWarp, r0 = threadIdx.x / kWarp;
  int begin, end;
  chunk_rows(N, begin, end);
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int n = begin + r0; n < end; n += kColumnRows) {
      const float g = dout[size_t(n) * C + c];
      aw += g * (inp[size_t(n) * C + c] - mean[n]) * rstd[n];
      ab += g;
    }
  }
  aw = column_block_sum(aw, part);
  ab = column_block_sum(ab, part);
  if (r0 == 0 && c < C) {
    const size_t k = blockIdx.y;
    partials[k * C + c] = aw;
    partials[(gridDim.y + k) * C + c] = ab;
  }
}

// ---------------------------------------------------------------------------
// residual
// ---------------------------------------------------------------------------

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, size_t n) {
  MESHLM_FOR_EACH(i, n) out[i] = a[i] + b[i];
}

__global__ void residual_backward_kernel(float* da, float* db, const float* dout, size_t n) {
  MESHLM_FOR_EACH(i, n) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

__global__ void add_kernel(float* y, const float* x, size_t n) {
  MESHLM_FOR_EACH(i, n) y[i] += x[i];
}

__global__ void fill_kernel(float* x, float value, size_t n) {
  MESHLM_FOR_EACH(i, n) x[i] = value;
}

__global__ void add_bias_kernel(float* out, const float* bias, int N, int C) {
  MESHLM_FOR_EACH(i, size_t(N) * C) out[i] += bias[i % C];
}

// ---------------------------------------------------------------------------
// vocabulary-parallel cross-entropy: a block per row of logits
// ---------------------------------------------------------------------------

__device__ __forceinline__ int real_columns(int Vl, int v0, int V) {
  const int n = V - v0;
  return n < 0 ? 0 : (n > Vl ? Vl : n);
}

__global__ void xent_local_max_kernel(float* rowmax, const float* logits, int Vl, int v0, int V) {
  __shared__ float scratch[kThreads / kWarp];
  const int nreal = real_columns(Vl, v0, V);
  const float* row = logits + size_t(blockIdx.x) * Vl;
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < nreal; v += kThreads) mx = fmaxf(mx, row[v]);
  mx = block_reduce<true>(mx, scratch);
  if (threadIdx.x == 0) rowmax[blockIdx.x] = mx;
}

__global__ void xent_local_sums_kernel(float* sums, const float* logits, const float* rowmax,
                                       const int32_t* targets, int Vl, int v0, int V) {
  __shared__ float scratch[kThreads / kWarp];
  const int nreal = real_columns(Vl, v0, V);
  const size_t n = blockIdx.x;
  const float* row = logits + n * Vl;
  const float mx = rowmax[n];
  float sum = 0.0f;
  for (int v = threadIdx.x; v < nreal; v += kThreads) sum += expf(row[v] - mx);
  sum = block_reduce<false>(sum, scratch);
  if (threadIdx.x == 0) {
    const int t = targets[n] - v0;
    sums[2 * n] = sum;
    sums[2 * n + 1] = (t >= 0 && t < nreal) ? row[t] : 0.0f;
  }
}

__global__ void xent_losses_kernel(float* losses, const float* rowmax, const float* sums, int N) {
  MESHLM_FOR_EACH(n, N) losses[n] = logf(sums[2 * n]) + rowmax[n] - sums[2 * n + 1];
}

__global__ void xent_local_backward_kernel(float* row_all, const float* rowmax, const float* sums,
                                           const float* dlosses, const int32_t* targets, int Vl,
                                           int v0, int V) {
  const int nreal = real_columns(Vl, v0, V);
  const size_t n = blockIdx.x;
  float* row = row_all + n * Vl;
  const float mx = rowmax[n], inv = 1.0f / sums[2 * n], d = dlosses[n];
  const int t = targets[n] - v0;
  for (int v = threadIdx.x; v < Vl; v += kThreads) {
    float g = v < nreal ? expf(row[v] - mx) * inv * d : 0.0f;
    if (v == t && v < nreal) g -= d;
    row[v] = g;
  }
}

// xent_rows: the rows hold the whole vocabulary (v0 = 0). A block of
// kXentRowThreads per row reads it once for its max and its sum of exp
// together (online: the sum rescaled whenever the max grows), and with
// dlosses writes the gradient in place in a second pass, while the row is
// likely still in L2. Large blocks keep few rows in flight, so that the
// second pass finds them there.
constexpr int kXentRowThreads = 1024;

__device__ __forceinline__ void online_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;  // m = -inf at first: s = 0 * 0 + 1
    m = x;
  } else if (m != -INFINITY) {
    s += expf(x - m);
  }
}

// (m, s) merged with (m2, s2): the same bits either way round.
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = (m == -INFINITY ? 0.0f : s * expf(m - mx)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mx));
  m = mx;
}

__global__ void __launch_bounds__(kXentRowThreads)
xent_rows_kernel(float* row_all, float* rowmax, float* sums, const float* dlosses,
                 const int32_t* targets, int Vl, int V, bool by4) {
  __shared__ float part_m[kXentRowThreads / kWarp], part_s[kXentRowThreads / kWarp];
  const int nreal = V < Vl ? V : Vl;
  const size_t n = blockIdx.x;
  float* row = row_all + n * Vl;
  float m = -INFINITY, s = 0.0f;
  const int quads = by4 ? nreal / 4 : 0;
  for (int i = threadIdx.x; i < quads; i += kXentRowThreads) {
    const float4 x = reinterpret_cast<const float4*>(row)[i];
    online_add(m, s, x.x);
    online_add(m, s, x.y);
    online_add(m, s, x.z);
    online_add(m, s, x.w);
  }
  for (int v = 4 * quads + threadIdx.x; v < nreal; v += kXentRowThreads) online_add(m, s, row[v]);
  for (int o = kWarp / 2; o > 0; o /= 2)
    online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) part_m[warp] = m, part_s[warp] = s;
  __syncthreads();
  if (warp == 0) {
    m = part_m[lane];
    s = part_s[lane];
    for (int o = kWarp / 2; o > 0; o /= 2)
      online_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) {
      const int t = targets[n];
      rowmax[n] = m;
      sums[2 * n] = s;
      sums[2 * n + 1] = (t >= 0 && t < nreal) ? row[t] : 0.0f;  // read before the row is overwritten
      part_m[0] = m;
      part_s[0] = s;
    }
  }
  if (dlosses == nullptr) return;
  __syncthreads();
  const float mx = part_m[0], inv = 1.0f / part_s[0], d = dlosses[n];
  const int t = targets[n];
  auto grad = [&](int v, float x) {
    float g = v < nreal ? expf(x - mx) * inv * d : 0.0f;
    if (v == t && v < nreal) g -= d;
    return g;
  };
  const int all_quads = by4 ? Vl / 4 : 0;
  for (int i = threadIdx.x; i < all_quads; i += kXentRowThreads) {
    float4 x = reinterpret_cast<float4*>(row)[i];
    const int v = 4 * i;
    x = make_float4(grad(v, x.x), grad(v + 1, x.y), grad(v + 2, x.z), grad(v + 3, x.w));
    reinterpret_cast<float4*>(row)[i] = x;
  }
  for (int v = 4 * all_quads + threadIdx.x; v < Vl; v += kXentRowThreads) row[v] = grad(v, row[v]);
}

#undef MESHLM_FOR_EACH

std::string dims(int N, int C) { return "N = " + std::to_string(N) + ", C = " + std::to_string(C); }

}  // namespace

// ---------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------

void embedding_forward(float* out, const int32_t* tokens, const float* wte_part, int N, int C,
                       int v0, int Vl, cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  check_launch(out && tokens && (wte_part || Vl == 0) && N > 0 && C > 0 && Vl >= 0,
               "embedding_forward", dims(N, C));
  embedding_forward_kernel<<<grid_for(size_t(N) * C), kThreads, 0, stream>>>(out, tokens, wte_part,
                                                                             N, C, v0, Vl);
  CUDA_CHECK(cudaGetLastError());
}

void embedding_backward(float* dwte_part, const float* dout, const int32_t* tokens, int N, int C,
                        int v0, int Vl, cudaStream_t stream) {
  if (N == 0 || C == 0 || Vl == 0) return;
  check_launch(dwte_part && dout && tokens && N > 0 && C > 0 && Vl > 0, "embedding_backward",
               dims(N, C));
  // The positions of each row of this part, grouped on the host (the N
  // token ids come back once: a wait for the stream) and uploaded as one
  // index of rows[U], starts[U + 1] and order[N'] (N' <= N positions on this
  // part).
  thread_local std::vector<int32_t> ids, index;
  ids.resize(size_t(N));
  CUDA_CHECK(cudaMemcpyAsync(ids.data(), tokens, size_t(N) * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<int32_t> count(size_t(Vl) + 1, 0);  // count[row + 1]: positions on row
  for (int n = 0; n < N; ++n) {
    const int row = ids[n] - v0;
    if (row >= 0 && row < Vl) ++count[size_t(row) + 1];
  }
  std::vector<int32_t> rows, starts{0};
  for (int r = 0; r < Vl; ++r)
    if (count[size_t(r) + 1] > 0) {
      rows.push_back(r);
      starts.push_back(starts.back() + count[size_t(r) + 1]);
    }
  // Room for the bound, whatever this batch needs (also where none of its
  // tokens falls in this rank's part of the vocabulary): what the prediction
  // says, so that the booking does not depend on the data.
  int32_t* d_index = embedding_index(stream, ops::embedding_index_bytes(N) / sizeof(int32_t));
  const int U = static_cast<int>(rows.size());
  if (U == 0) return;
  for (int r = 0; r < Vl; ++r) count[size_t(r) + 1] += count[size_t(r)];  // first slot of row r
  index.assign(size_t(2 * U + 1) + size_t(starts.back()), 0);
  std::copy(rows.begin(), rows.end(), index.begin());
  std::copy(starts.begin(), starts.end(), index.begin() + U);
  int32_t* order = index.data() + 2 * U + 1;
  for (int n = 0; n < N; ++n) {  // increasing n within each row
    const int row = ids[n] - v0;
    if (row >= 0 && row < Vl) order[count[size_t(row)]++] = n;
  }
  CUDA_CHECK(cudaMemcpyAsync(d_index, index.data(), index.size() * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream));
  const dim3 grid(static_cast<unsigned>(U), static_cast<unsigned>((C + kThreads - 1) / kThreads));
  embedding_backward_kernel<<<grid, kThreads, 0, stream>>>(dwte_part, dout, d_index, d_index + U,
                                                           d_index + 2 * U + 1, C);
  CUDA_CHECK(cudaGetLastError());
}

void position_forward(float* out, const float* wpe, int B, int Tn, int C, cudaStream_t stream) {
  const size_t n = size_t(B) * Tn * C;
  if (n == 0) return;
  check_launch(out && wpe && B > 0 && Tn > 0 && C > 0, "position_forward", dims(B * Tn, C));
  position_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, wpe, B, Tn, C);
  CUDA_CHECK(cudaGetLastError());
}

void position_backward(float* dwpe, const float* dout, int B, int Tn, int C, cudaStream_t stream) {
  if (size_t(B) * Tn * C == 0) return;
  check_launch(dwpe && dout && B > 0 && Tn > 0 && C > 0, "position_backward", dims(B * Tn, C));
  position_backward_kernel<<<grid_for(size_t(Tn) * C), kThreads, 0, stream>>>(dwpe, dout, B, Tn,
                                                                              C);
  CUDA_CHECK(cudaGetLastError());
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  check_launch(out && mean && rstd && inp && w && b && N > 0 && C > 0, "layernorm_forward",
               dims(N, C));
  layernorm_forward_kernel<false><<<grid_for_rows(N), kThreads, 0, stream>>>(out, mean, rstd, inp,
                                                                             w, b, N, C);
  CUDA_CHECK(cudaGetLastError());
}

void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* w, const float* bias, int N, int C,
                                cudaStream_t stream) {
  if (N == 0) return;
  check_launch(res && out && mean && rstd && a && b && w && bias && N > 0 && C > 0,
               "residual_layernorm_forward", dims(N, C));
  layernorm_forward_kernel<true><<<grid_for_rows(N), kThreads, 0, stream>>>(
      out, mean, rstd, a, w, bias, N, C, res, b);
  CUDA_CHECK(cudaGetLastError());
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream) {
  if (N == 0) return;
  check_launch(dinp && dout && inp && w && mean && rstd && (dw == nullptr) == (db == nullptr) &&
                   N > 0 && C > 0,
               "layernorm_backward", dims(N, C));
  layernorm_backward_dinp_kernel<<<grid_for_rows(N), kThreads, 0, stream>>>(dinp, dout, inp, w,
                                                                            mean, rstd, N, C);
  CUDA_CHECK(cudaGetLastError());
  if (dw == nullptr) return;  // frozen gain and bias
  const dim3 grid = column_partials_grid(N, C);
  const int chunks = static_cast<int>(grid.y);
  float* partials = column_partials(stream, 2 * size_t(chunks) * C);
  layernorm_dwdb_partials_kernel<<<grid, kThreads, 0, stream>>>(partials, dout, inp, mean, rstd,
                                                                N, C);
  CUDA_CHECK(cudaGetLastError());
  add_column_partials(dw, partials, chunks, C, stream);
  add_column_partials(db, partials + size_t(chunks) * C, chunks, C, stream);
}

void residual_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  check_launch(out && a && b, "residual_forward", "n = " + std::to_string(n));
  residual_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, a, b, n);
  CUDA_CHECK(cudaGetLastError());
}

void residual_backward(float* da, float* db, const float* dout, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  check_launch(da && db && dout, "residual_backward", "n = " + std::to_string(n));
  residual_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(da, db, dout, n);
  CUDA_CHECK(cudaGetLastError());
}

void add(float* y, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  check_launch(y && x, "add", "n = " + std::to_string(n));
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n);
  CUDA_CHECK(cudaGetLastError());
}

void fill(float* x, float value, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  check_launch(x, "fill", "n = " + std::to_string(n));
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, value, n);
  CUDA_CHECK(cudaGetLastError());
}

void add_bias(float* out, const float* bias, int N, int C, cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  check_launch(out && bias && N > 0 && C > 0, "add_bias", dims(N, C));
  add_bias_kernel<<<grid_for(size_t(N) * C), kThreads, 0, stream>>>(out, bias, N, C);
  CUDA_CHECK(cudaGetLastError());
}

void xent_local_max(float* rowmax, const float* logits, int N, int Vl, int v0, int V,
                    cudaStream_t stream) {
  if (N == 0) return;
  check_launch(rowmax && logits && N > 0 && Vl > 0, "xent_local_max", "N = " + std::to_string(N) + ", Vl = " + std::to_string(Vl));
  xent_local_max_kernel<<<N, kThreads, 0, stream>>>(rowmax, logits, Vl, v0, V);
  CUDA_CHECK(cudaGetLastError());
}

void xent_local_sums(float* sums, const float* logits, const float* rowmax,
                     const int32_t* targets, int N, int Vl, int v0, int V, cudaStream_t stream) {
  if (N == 0) return;
  check_launch(sums && logits && rowmax && targets && N > 0 && Vl > 0, "xent_local_sums",
               "N = " + std::to_string(N) + ", Vl = " + std::to_string(Vl));
  xent_local_sums_kernel<<<N, kThreads, 0, stream>>>(sums, logits, rowmax, targets, Vl, v0, V);
  CUDA_CHECK(cudaGetLastError());
}

void xent_losses(float* losses, const float* rowmax, const float* sums, int N,
                 cudaStream_t stream) {
  if (N == 0) return;
  check_launch(losses && rowmax && sums && N > 0, "xent_losses", "N = " + std::to_string(N));
  xent_losses_kernel<<<grid_for(N), kThreads, 0, stream>>>(losses, rowmax, sums, N);
  CUDA_CHECK(cudaGetLastError());
}

void xent_local_backward(float* logits_dlogits, const float* rowmax, const float* sums,
                         const float* dlosses, const int32_t* targets, int N, int Vl, int v0,
                         int V, cudaStream_t stream) {
  if (N == 0) return;
  check_launch(logits_dlogits && rowmax && sums && dlosses && targets && N > 0 && Vl > 0,
               "xent_local_backward", "N = " + std::to_string(N) + ", Vl = " + std::to_string(Vl));
  xent_local_backward_kernel<<<N, kThreads, 0, stream>>>(logits_dlogits, rowmax, sums, dlosses,
                                                        targets, Vl, v0, V);
  CUDA_CHECK(cudaGetLastError());
}

void xent_rows(float* logits_dlogits, float* rowmax, float* sums, const float* dlosses,
               const int32_t* targets, int N, int Vl, int V, cudaStream_t stream) {
  if (N == 0) return;
  check_launch(logits_dlogits && rowmax && sums && targets && N > 0 && Vl > 0 && V > 0 && V <= Vl,
               "xent_rows", "N = " + std::to_string(N) + ", Vl = " + std::to_string(Vl) +
                                ", V = " + std::to_string(V));
  const bool by4 = Vl % 4 == 0 && reinterpret_cast<uintptr_t>(logits_dlogits) % 16 == 0;
  xent_rows_kernel<<<N, kXentRowThreads, 0, stream>>>(logits_dlogits, rowmax, sums, dlosses,
                                                      targets, Vl, V, by4);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace meshlm::cuda
