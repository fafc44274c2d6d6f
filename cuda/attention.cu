// Causal multi-head self-attention on the GPU, the first correct version:
// the same three GEMMs per (batch row, head) as src/ops/attention.cpp, as
// cuBLAS strided-batched GEMMs over the heads (one call per batch row: the
// heads of qkv(B,T,3C) are HS apart, the rows 3C apart), and a masked
// softmax kernel with one warp per row of att(B,NH,T,T). It keeps the
// (B,NH,T,T) probabilities; a fused (flash-style) kernel that does not is
// tested against this one.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "cuda/blas.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/launch.cuh"
#include "cuda/ops_cuda.h"

namespace meshlm::cuda {

namespace {

// Row r of att (B*NH*T rows of T): causal softmax in place over s <= t,
// t = r % T, zeros above the diagonal. The scores come already scaled.
__global__ void causal_softmax_kernel(float* att, long long rows, int Tn) {
  const long long r = warp_row(rows);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp, t = static_cast<int>(r % Tn);
  float* row = att + r * Tn;
  float mx = -INFINITY;
  for (int s = lane; s <= t; s += kWarp) mx = fmaxf(mx, row[s]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int s = lane; s <= t; s += kWarp) {
    const float e = expf(row[s] - mx);
    row[s] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int s = lane; s < Tn; s += kWarp) row[s] = s <= t ? row[s] * inv : 0.0f;
}

// In place on datt: dS = P (dP - sum_s P dP) scale over s <= t; 0 above.
__global__ void causal_softmax_backward_kernel(float* datt, const float* att, long long rows,
                                               int Tn, float scale) {
  const long long r = warp_row(rows);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp, t = static_cast<int>(r % Tn);
  const float* p = att + r * Tn;
  float* d = datt + r * Tn;
  float dot = 0.0f;
  for (int s = lane; s <= t; s += kWarp) dot += p[s] * d[s];
  dot = warp_sum(dot);
  for (int s = lane; s < Tn; s += kWarp) d[s] = s <= t ? p[s] * (d[s] - dot) * scale : 0.0f;
}

void check_args(bool ok, const char* op, int B, int Tn, int C, int NH) {
  MESHLM_CHECK(ok && B > 0 && Tn > 0 && C > 0 && NH > 0 && C % NH == 0,
               std::string("cuda::") + op + " with B = " + std::to_string(B) + ", T = " +
                   std::to_string(Tn) + ", C = " + std::to_string(C) + ", NH = " +
                   std::to_string(NH));
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int Tn, int C, int NH,
                       cudaStream_t stream, ops::Precision pr) {
  check_args(out && att && qkv, "attention_forward", B, Tn, C, NH);
  const int HS = C / NH, C3 = 3 * C;
  const long long TT = static_cast<long long>(Tn) * Tn;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  for (int b = 0; b < B; ++b) {  // S = scale Q K^T
    const float* q = qkv + static_cast<size_t>(b) * Tn * C3;
    gemm_strided_batched_rm(stream, pr, false, true, Tn, Tn, HS, scale, q, C3, HS, q + C, C3, HS, 0.0f,
                            att + b * NH * TT, Tn, TT, NH);
  }
  const long long rows = static_cast<long long>(B) * NH * Tn;
  causal_softmax_kernel<<<grid_for_rows(rows), kThreads, 0, stream>>>(att, rows, Tn);
  CUDA_CHECK(cudaGetLastError());
  for (int b = 0; b < B; ++b) {  // Y = P V
    const float* v = qkv + static_cast<size_t>(b) * Tn * C3 + 2 * C;
    gemm_strided_batched_rm(stream, pr, false, false, Tn, HS, Tn, 1.0f, att + b * NH * TT, Tn, TT, v,
                            C3, HS, 0.0f, out + static_cast<size_t>(b) * Tn * C, C, HS, NH);
  }
}

void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int Tn, int C, int NH, cudaStream_t stream,
                        ops::Precision pr) {
  check_args(dqkv && datt && dout && qkv && att, "attention_backward", B, Tn, C, NH);
  const int HS = C / NH, C3 = 3 * C;
  const long long TT = static_cast<long long>(Tn) * Tn;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  for (int b = 0; b < B; ++b) {
    const size_t qoff = static_cast<size_t>(b) * Tn * C3;
    const float* dy = dout + static_cast<size_t>(b) * Tn * C;
    const float* p = att + b * NH * TT;
    // dP = dY V^T ; dV = P^T dY
    gemm_strided_batched_rm(stream, pr, false, true, Tn, Tn, HS, 1.0f, dy, C, HS, qkv + qoff + 2 * C,
                            C3, HS, 0.0f, datt + b * NH * TT, Tn, TT, NH);
    gemm_strided_batched_rm(stream, pr, true, false, Tn, HS, Tn, 1.0f, p, Tn, TT, dy, C, HS, 0.0f,
                            dqkv + qoff + 2 * C, C3, HS, NH);
  }
  const long long rows = static_cast<long long>(B) * NH * Tn;
  causal_softmax_backward_kernel<<<grid_for_rows(rows), kThreads, 0, stream>>>(datt, att, rows, Tn,
                                                                           scale);
  CUDA_CHECK(cudaGetLastError());
  for (int b = 0; b < B; ++b) {
    const size_t qoff = static_cast<size_t>(b) * Tn * C3;
    const float* ds = datt + b * NH * TT;
    // dQ = dS K ; dK = dS^T Q  (scale folded into dS)
    gemm_strided_batched_rm(stream, pr, false, false, Tn, HS, Tn, 1.0f, ds, Tn, TT, qkv + qoff + C, C3,
                            HS, 0.0f, dqkv + qoff, C3, HS, NH);
    gemm_strided_batched_rm(stream, pr, true, false, Tn, HS, Tn, 1.0f, ds, Tn, TT, qkv + qoff, C3, HS,
                            0.0f, dqkv + qoff + C, C3, HS, NH);
  }
}

}  // namespace meshlm::cuda
