// Launch shapes and warp/block reductions shared by the kernels of cuda/.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace meshlm::cuda {

constexpr int kWarp = 32;
constexpr int kThreads = 256;  // threads per block of the elementwise and row kernels
// Larger grids loop (grid stride): 2^16 blocks of 256 threads fill any GPU.
constexpr size_t kMaxGrid = size_t(1) << 16;

// Blocks of kThreads for n independent items, at most kMaxGrid.
inline unsigned grid_for(size_t n) {
  return static_cast<unsigned>(std::min((n + kThreads - 1) / kThreads, kMaxGrid));
}

// Blocks of kThreads with one warp per row, for `rows` rows (at most
// 2^34: a grid within CUDA's 2^31 - 1 blocks).
inline unsigned grid_for_rows(long long rows) {
  constexpr long long kWarpsPerBlock = kThreads / kWarp;
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// Kernels with one warp per row: this thread's row, or -1 past the last.
__device__ __forceinline__ long long warp_row(long long rows) {
  const long long r = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  return r < rows ? r : -1;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A warp-per-row kernel's residual add (residual_layernorm_forward,
// residual_rmsnorm_forward): this lane's elements c = lane, lane + kWarp, ...
// of res = x + y written, and the lane's sum of term(v) over them returned.
// The row's later passes read res back, each lane only what it wrote.
template <typename Term>
__device__ __forceinline__ float add_row(float* res, const float* x, const float* y, int C,
                                         Term term) {
  float sum = 0.0f;
  for (int c = threadIdx.x % kWarp; c < C; c += kWarp) {
    const float v = x[c] + y[c];
    res[c] = v;
    sum += term(v);
  }
  return sum;
}

// The sum (or max) over a block of kThreads threads, returned to every
// thread. `scratch` holds kThreads / kWarp floats; the block must not use it
// again before a __syncthreads().
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kThreads / kWarp ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(v) : warp_sum(v);
}

// Sums over the rows of columns (LayerNorm's dw and db, a bias gradient), in
// a fixed order with no atomics: a block of kThreads per kWarp columns;
// thread (lane, r0) sums rows r0, r0 + kColumnRows, ... of column
// blockIdx.x * kWarp + lane into `acc`, and column_block_sum adds the
// kColumnRows partial sums of each column in row order. The total is valid in
// the threads of warp 0 (r0 == 0). Every thread of the block must call it.
constexpr int kColumnRows = kThreads / kWarp;
__device__ __forceinline__ float column_block_sum(float acc, float (&part)[kColumnRows][kWarp]) {
  const int lane = threadIdx.x % kWarp, r0 = threadIdx.x / kWarp;
  __syncthreads();  // part may still be read by an earlier call
  part[r0][lane] = acc;
  __syncthreads();
  if (r0 == 0)
    for (int r = 1; r < kColumnRows; ++r) acc += part[r][lane];
  return acc;
}

}  // namespace meshlm::cuda
