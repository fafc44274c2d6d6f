// GELU, tanh approximation, as in GPT-2 (torch: approximate='tanh'): the
// CUDA version of src/ops/gelu.cpp, which is its reference.
//
// Elementwise and memory bound: each thread moves float4s (16-byte loads and
// stores) in a grid-stride loop, and the few elements past the last whole
// float4 are done one at a time, so n need not be a multiple of 4. When a
// pointer is not 16-byte aligned (a tensor at an odd offset inside a larger
// allocation) the whole range takes the one-at-a-time path.
//
// tanhf must be the accurate one (2 ulp): meshlm_cuda is built without
// --use_fast_math, under which nvcc (CUDA 13.0) turns tanhf() into the
// tanh.approx.f32 instruction (relative error about 2^-11) and GELU would
// differ from the CPU reference in the 4th digit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.cuh"
#include "cuda/ops_cuda.h"

namespace meshlm::cuda {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

constexpr int kBlockSize = 256;
// Grids larger than this loop (grid stride) instead: 2^16 blocks of 256
// threads already fill any current GPU many times over.
constexpr size_t kMaxBlocks = size_t(1) << 16;

// ---------------------------------------------------------------------------
// kernels
// ---------------------------------------------------------------------------

__device__ __forceinline__ float gelu_value(float x) {
  float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// d gelu / dx, the same expression as the CPU op.
__device__ __forceinline__ float gelu_grad(float x) {
  float u = kGeluScale * (x + kGeluCubic * x * x * x);
  float th = tanhf(u);
  float sech2 = 1.0f - th * th;
  float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * du_dx;
}

// Elements [0, 4 nvec) as float4, elements [4 nvec, n) one at a time. The
// launcher passes nvec = 0 unless every pointer is 16-byte aligned. Each
// element is read before it is written by the same thread, so out == inp is
// safe.
__global__ void gelu_forward_kernel(float* out, const float* inp, size_t nvec, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float4* out4 = reinterpret_cast<float4*>(out);
  const float4* inp4 = reinterpret_cast<const float4*>(inp);
  for (size_t i = first; i < nvec; i += stride) {
    float4 x = inp4[i];
    out4[i] = make_float4(gelu_value(x.x), gelu_value(x.y), gelu_value(x.z), gelu_value(x.w));
  }
  for (size_t i = 4 * nvec + first; i < n; i += stride) out[i] = gelu_value(inp[i]);
}

// dinp = gelu'(inp) * dout (overwritten), split as in gelu_forward_kernel.
__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t nvec,
                                     size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t first = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float4* dinp4 = reinterpret_cast<float4*>(dinp);
  const float4* inp4 = reinterpret_cast<const float4*>(inp);
  const float4* dout4 = reinterpret_cast<const float4*>(dout);
  for (size_t i = first; i < nvec; i += stride) {
    float4 x = inp4[i];
    float4 g = dout4[i];
    dinp4[i] = make_float4(gelu_grad(x.x) * g.x, gelu_grad(x.y) * g.y, gelu_grad(x.z) * g.z,
                           gelu_grad(x.w) * g.w);
  }
  for (size_t i = 4 * nvec + first; i < n; i += stride) dinp[i] = gelu_grad(inp[i]) * dout[i];
}

// ---------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// One thread per float4 of the body, or per element of the tail when that is
// longer (it is only when nothing is vectorised).
unsigned grid_size(size_t nvec, size_t n) {
  size_t work = std::max(nvec, n - 4 * nvec);
  size_t blocks = (work + kBlockSize - 1) / kBlockSize;
  return static_cast<unsigned>(std::min(blocks, kMaxBlocks));
}

}  // namespace

void gelu_forward(float* out, const float* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  MESHLM_CHECK(out != nullptr && inp != nullptr, "cuda::gelu_forward with n = " + std::to_string(n));
  const size_t nvec = aligned16(out) && aligned16(inp) ? n / 4 : 0;
  gelu_forward_kernel<<<grid_size(nvec, n), kBlockSize, 0, stream>>>(out, inp, nvec, n);
  CUDA_CHECK(cudaGetLastError());
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                   cudaStream_t stream) {
  if (n == 0) return;
  MESHLM_CHECK(dinp != nullptr && inp != nullptr && dout != nullptr,
               "cuda::gelu_backward with n = " + std::to_string(n));
  const size_t nvec = aligned16(dinp) && aligned16(inp) && aligned16(dout) ? n / 4 : 0;
  gelu_backward_kernel<<<grid_size(nvec, n), kBlockSize, 0, stream>>>(dinp, inp, dout, nvec, n);
  CUDA_CHECK(cudaGetLastError());
}

// ---------------------------------------------------------------------------
// devices
// ---------------------------------------------------------------------------

int device_count(std::string* reason) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Clear the error so that the next CUDA_CHECK(cudaGetLastError()) does
    // not report this query.
    (void)cudaGetLastError();
    if (reason != nullptr)
      *reason = std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
    return 0;
  }
  if (count == 0 && reason != nullptr) *reason = "the CUDA driver lists no device";
  return count;
}

}  // namespace meshlm::cuda
