// AdamW, the gradient norm and its clipping, and a micro-batch's mean loss on
// the GPU: the CUDA version of train/adamw.cpp, in float as there, every
// parameter tensor in one launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops_cuda.h"
#include "ops/ops.h"

namespace meshlm::cuda {

namespace {

// Blocks (x, segment): each row of blocks walks its segment grid-stride.
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v,
                             const AdamWSegment* segments, AdamWStep h) {
  const AdamWSegment seg = segments[blockIdx.y];
  const float decay = seg.decay ? 1.0f - h.lr * h.weight_decay : 1.0f;
  const float step_size = h.lr / h.bias_correction1;
  for (size_t k = size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < seg.count;
       k += size_t(gridDim.x) * blockDim.x) {
    const size_t i = seg.begin + k;
    const float g = grads[i] * h.unscale * h.clip;  // as ops::adamw_update
    const float mi = h.beta1 * m[i] + (1.0f - h.beta1) * g;
    const float vi = h.beta2 * v[i] + (1.0f - h.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] = params[i] * decay - step_size * mi / (sqrtf(vi) / h.bias_correction2_sqrt + h.eps);
  }
}

constexpr size_t kSumBlock = ops::kSumOfSquaresBlock;  // as ops::sum_of_squares

// The sum of every thread's `s` over a block of kThreads, in double: each
// warp's by shuffles, then thread 0 adds the warps' in order. Valid in
// thread 0 only.
__device__ double block_sum_in_order(double s) {
  __shared__ double warp_sums[kThreads / kWarp];
  for (int o = kWarp / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % kWarp == 0) warp_sums[threadIdx.x / kWarp] = s;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / kWarp; ++w) total += warp_sums[w];
  return total;
}

// Block b: the sum of squares of elements [b kSumBlock, (b+1) kSumBlock), in double.
__global__ void partial_squares_kernel(double* partial, const float* g, size_t n) {
  const size_t begin = size_t(blockIdx.x) * kSumBlock;
  const size_t end = begin + kSumBlock < n ? begin + kSumBlock : n;
  double s = 0.0;
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads) s += double(g[i]) * g[i];
  const double total = block_sum_in_order(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// One thread adds the partial sums in order.
__global__ void sum_partials_kernel(double* out, const double* partial, size_t nblocks) {
  double total = 0.0;
  for (size_t b = 0; b < nblocks; ++b) total += partial[b];
  *out = total;
}

// One block: out[0] = (sum of x in double) / n, each thread summing every
// kThreads-th element.
__global__ void mean_kernel(float* out, const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = threadIdx.x; i < n; i += kThreads) s += x[i];
  const double total = block_sum_in_order(s);
  if (threadIdx.x == 0) out[0] = static_cast<float>(total / static_cast<double>(n));
}

__global__ void scale_kernel(float* x, size_t n, float factor) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    x[i] *= factor;
}

}  // namespace

void adamw_step(float* params, const float* grads, float* m, float* v,
                const AdamWSegment* segments, int nseg, size_t max_count, const AdamWStep& h,
                cudaStream_t stream) {
  if (nseg == 0 || max_count == 0) return;
  MESHLM_CHECK(params && grads && m && v && segments && nseg > 0 && nseg <= 65535,
               "cuda::adamw_step with " + std::to_string(nseg) + " segments (at most 65535)");
  // Each segment's row of blocks strides over it: at most kSegmentBlocks per
  // row, so that a model of a few large tensors and many small ones (wte's
  // 38.6 M elements beside 768-element vectors) launches a few hundred
  // thousand blocks, not millions that find nothing to do.
  constexpr unsigned kSegmentBlocks = 1024;
  const dim3 grid(std::min(grid_for(max_count), kSegmentBlocks), static_cast<unsigned>(nseg));
  adamw_kernel<<<grid, kThreads, 0, stream>>>(params, grads, m, v, segments, h);
  CUDA_CHECK(cudaGetLastError());
}

size_t sum_of_squares_scratch(size_t n) { return (n + kSumBlock - 1) / kSumBlock; }

void sum_of_squares(double* out, double* scratch, const float* grads, size_t n,
                    cudaStream_t stream) {
  MESHLM_CHECK(out != nullptr && (n == 0 || (grads != nullptr && scratch != nullptr)),
               "cuda::sum_of_squares with n = " + std::to_string(n));
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  const size_t nblocks = sum_of_squares_scratch(n);
  partial_squares_kernel<<<static_cast<unsigned>(nblocks), kThreads, 0, stream>>>(scratch, grads,
                                                                                 n);
  CUDA_CHECK(cudaGetLastError());
  sum_partials_kernel<<<1, 1, 0, stream>>>(out, scratch, nblocks);
  CUDA_CHECK(cudaGetLastError());
}

void mean(float* out, const float* x, size_t n, cudaStream_t stream) {
  MESHLM_CHECK(out != nullptr && x != nullptr && n >= 1, "cuda::mean with n = " + std::to_string(n));
  mean_kernel<<<1, kThreads, 0, stream>>>(out, x, n);
  CUDA_CHECK(cudaGetLastError());
}

void scale(float* grads, size_t n, float factor, cudaStream_t stream) {
  if (n == 0) return;
  MESHLM_CHECK(grads != nullptr, "cuda::scale with n = " + std::to_string(n));
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(grads, n, factor);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace meshlm::cuda
