// The CUDA implementation of the ops interface of src/ops/ops.h.
//
// Each op here has the semantics of its CPU namesake in meshlm::ops, which is
// the reference it is tested against (tests/cuda/): same argument order,
// same shapes (dimension letters as in src/ops/ops.h), same conventions:
//   * Forward ops overwrite their outputs.
//   * Backward ops ACCUMULATE (+=) into parameter gradients and the residual
//     stream's; the input gradients of matmul, attention and GELU are
//     OVERWRITTEN.
// Differences from the CPU ops:
//   * float only (training precision); the double instantiations of the CPU
//     ops exist for finite-difference checks, which stay on the CPU.
//   * Every pointer is device memory (or managed memory).
//   * Every op takes the stream it runs on and is asynchronous with respect
//     to the host: it returns once the work is queued. Arguments are checked
//     and the launch is checked (cudaGetLastError) before it returns; errors
//     raised while the kernel runs surface at the next synchronising call.
//   * Errors throw meshlm::RankError (cuda/cuda_check.cuh).
//
// This header is plain C++ so that host code compiled by g++ can call the
// CUDA backend; the kernels live in cuda/*.cu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/ops.h"

// cudaStream_t as <cuda_runtime_api.h> declares it, without that header.
struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace meshlm::quant {
struct QSlice;  // quant/qlinear.h
}

namespace meshlm::cuda {

// ---- devices ------------------------------------------------------------------
// Number of CUDA devices this process can use. Never throws: 0 when there is
// no driver, no device, or the runtime cannot start for any other reason; then
// `reason` (when given) receives the CUDA error, for messages such as the skip
// of a GPU test. A program that was asked to run on a GPU should treat 0 as
// a fatal error naming that reason.
int device_count(std::string* reason = nullptr);
// Frees this host thread's 16-bit GEMM input copies on `stream`, whose work
// has ended (cuda/blas.cu; with the stream's device context).
void release_gemm_copies(cudaStream_t stream);

// ---- GELU, tanh approximation (as GPT-2) --------------------------------------
// out(n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x = inp(n).
// out may equal inp (in place); otherwise the arrays must not overlap. n may
// be 0 (nothing is launched). Any n and any float alignment: 16-byte aligned
// arrays take the float4 path. Agrees with ops::gelu_forward<float> to a few
// 1e-7 of |out| + |x| (tests/cuda/test_cuda_gelu.cpp explains the scale):
// tanh is computed to full float precision (no --use_fast_math; see
// cuda/gelu.cu).
void gelu_forward(float* out, const float* inp, size_t n, cudaStream_t stream);
// dinp(n) = gelu'(inp) * dout(n); inp is the forward INPUT (x), not out.
// dinp must not overlap inp or dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                   cudaStream_t stream);

// ---- embeddings (ops::embedding_*, ops::position_*) -----------------------------
// out(N,C) = wte_part[token - v0], 0 for tokens outside [v0, v0 + Vl).
void embedding_forward(float* out, const int32_t* tokens, const float* wte_part, int N, int C,
                       int v0, int Vl, cudaStream_t stream);
// dwte_part[token - v0] += dout[n], each row adding its positions in
// increasing n (no atomics: the CPU op's bits, every run). The token ids come
// to the host to group the positions by row: it waits for the stream.
void embedding_backward(float* dwte_part, const float* dout, const int32_t* tokens, int N, int C,
                        int v0, int Vl, cudaStream_t stream);
// out(B,T,C) += wpe[t];  dwpe[t] += sum_b dout[b,t]
void position_forward(float* out, const float* wpe, int B, int Tn, int C, cudaStream_t stream);
void position_backward(float* dwpe, const float* dout, int B, int Tn, int C, cudaStream_t stream);

// ---- layer norm (eps = 1e-5) ------------------------------------------------------
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, cudaStream_t stream);
// res = a + b, then out = layernorm(res), a warp per row: res is written once
// and the row's later passes read it back from cache (ops::residual_layernorm_forward).
void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                const float* b, const float* w, const float* bias, int N, int C,
                                cudaStream_t stream);
// dw and db may be null together (frozen gain and bias); sums over rows run
// in a fixed order.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream);

// ---- linear layer (cuBLAS) ----------------------------------------------------------
// out(N,OC) = inp(N,IC) w(OC,IC)^T + bias(OC); bias may be null. At fp32
// the GEMMs run with TF32 off, so that they can be checked tightly against
// the CPU; at bf16/fp16 cuBLAS rounds their inputs and accumulates in fp32
// (cuda/blas.cu).
// Inputs of a linear layer already rounded to its precision (bf16 and fp16
// only; Kernels::hold_rounded): the GEMMs read these copies instead of
// rounding their own. Null: none held.
struct Held16 {
  const void* inp = nullptr;
  const void* w = nullptr;
  const void* dout = nullptr;
};
void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int IC,
                    int OC, cudaStream_t stream, ops::Precision p = ops::Precision::fp32,
                    const Held16& held = {});
// dinp = dout w; dw += dout^T inp; dbias += sum_n dout; any of the three may be null.
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, int N, int IC, int OC, cudaStream_t stream,
                     ops::Precision p = ops::Precision::fp32, const Held16& held = {});

// ---- causal self-attention ------------------------------------------------------------
// The first correct version, kept as the reference of fused ones: per batch
// row, cuBLAS strided-batched GEMMs over the heads and a masked softmax
// kernel. att(B,NH,T,T) keeps the probabilities; datt is scratch; dqkv is
// overwritten.
void attention_forward(float* out, float* att, const float* qkv, int B, int Tn, int C, int NH,
                       cudaStream_t stream, ops::Precision p = ops::Precision::fp32);
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int Tn, int C, int NH, cudaStream_t stream,
                        ops::Precision p = ops::Precision::fp32);

// The fused version (cuda/flash_attention.cu), as ops::flash_attention_*:
// lse(B,NH,T) instead of the probabilities, one kernel for the forward and
// two for the backward (dK and dV per key block, dQ per query block, so no
// atomics: the same bits every run), tiles multiplied on the tensor cores at
// bf16 or fp16. dqkv is overwritten; delta(B,NH,T) is scratch. Only where
// ops::flash_attention_on_gpu(p, C / NH).
void flash_attention_forward(float* out, float* lse, const float* qkv, int B, int Tn, int C,
                             int NH, cudaStream_t stream, ops::Precision p);
void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* out,
                              const float* qkv, const float* lse, int B, int Tn, int C, int NH,
                              cudaStream_t stream, ops::Precision p);

// ---- Llama's ops (cuda/llama_ops.cu; ops::rmsnorm_*, rope_*, swiglu_*, gqa_pack_*) ----
// RMSNorm, a warp per row; dw (may be null: frozen) a sum over rows in a
// fixed order, the same bits every run.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                     double eps, cudaStream_t stream);
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int N, int C, cudaStream_t stream);
// res = a + b, then out = rmsnorm(res), a warp per row: res is written once
// and read back from cache (ops::residual_rmsnorm_forward).
void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b,
                              const float* w, int N, int C, double eps, cudaStream_t stream);
// In place on `heads` heads of HS channels at the start of rows ld apart;
// cos and sin (Tn, HS/2) in device memory.
void rope_forward(float* x, const float* cos, const float* sin, int B, int Tn, int heads, int HS,
                  size_t ld, cudaStream_t stream);
void rope_backward(float* dx, const float* cos, const float* sin, int B, int Tn, int heads, int HS,
                   size_t ld, cudaStream_t stream);
void swiglu_forward(float* out, const float* gate, const float* up, int N, int F, size_t ld,
                    cudaStream_t stream);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int N, int F, size_t ld, cudaStream_t stream);
void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int N, int NH,
                      int NKV, int HS, ops::GqaMap m, cudaStream_t stream);
void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int N, int NH, int NKV,
                       int HS, ops::GqaMap m, cudaStream_t stream);

// ---- attention against a key/value cache (cuda/cached_attention.cu) -------------------
// ops::cached_attention_forward in fp32 (whatever the backend's precision):
// the new rows appended to the caches, each score a warp's dot product, each
// (row, head) a block's softmax and product with V, summed in a fixed order
// (the same bits every run). scratch: cached_attention_scratch(n, keys, NH)
// floats (the scores).
size_t cached_attention_scratch(int n, int keys, int NH);
void cached_attention_forward(float* out, float* kc, float* vc, const float* q, size_t ldq,
                              const float* k, const float* v, size_t ldkv, int n, int p0, int NH,
                              int NKV, int HS, float* scratch, size_t scratch_floats,
                              cudaStream_t stream);

// ---- residual -------------------------------------------------------------------------
void residual_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);
// da += dout; db += dout
void residual_backward(float* da, float* db, const float* dout, size_t n, cudaStream_t stream);

// y(n) += x(n);  out(N,C) += bias(C) on every row
void add(float* y, const float* x, size_t n, cudaStream_t stream);
// x(n) = value
void fill(float* x, float value, size_t n, cudaStream_t stream);
void add_bias(float* out, const float* bias, int N, int C, cudaStream_t stream);

// ---- vocabulary-parallel softmax cross-entropy (ops::xent_*) ----------------------------
void xent_local_max(float* rowmax, const float* logits, int N, int Vl, int v0, int V,
                    cudaStream_t stream);
void xent_local_sums(float* sums, const float* logits, const float* rowmax,
                     const int32_t* targets, int N, int Vl, int v0, int V, cudaStream_t stream);
void xent_losses(float* losses, const float* rowmax, const float* sums, int N,
                 cudaStream_t stream);
void xent_local_backward(float* logits_dlogits, const float* rowmax, const float* sums,
                         const float* dlosses, const int32_t* targets, int N, int Vl, int v0,
                         int V, cudaStream_t stream);

// ops::Kernels::xent_rows: rows holding the whole vocabulary (V <= Vl, v0 = 0);
// xent_local_max and xent_local_sums in one read of each row, and with
// dlosses xent_local_backward in place. The sum of exp is taken online, so
// its last bits may differ from xent_local_sums'.
void xent_rows(float* logits_dlogits, float* rowmax, float* sums, const float* dlosses,
               const int32_t* targets, int N, int Vl, int V, cudaStream_t stream);

// ---- optimizer (train/adamw.h) ---------------------------------------------------------
// AdamW's segments and hyperparameters are those of the CPU optimizer (ops/ops.h).
using AdamWSegment = ops::AdamWSegment;
using AdamWStep = ops::AdamWHyper;
// AdamW::step on the GPU, all segments in one launch: per element i of a
// segment, g = (grads unscale) clip; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p = p decay - lr / bc1 * m / (sqrt(v) / bc2_sqrt + eps). `segments` is
// device memory (nseg entries), the same for every step.
void adamw_step(float* params, const float* grads, float* m, float* v,
                const AdamWSegment* segments, int nseg, size_t max_count, const AdamWStep& h,
                cudaStream_t stream);
// sum g^2 over n elements into *out (device, one double), in double, in a
// fixed order (blocks of 2^16 elements, then their sums in order): the same
// bits every run. `scratch` is device memory of sum_of_squares_scratch(n)
// doubles (the caller allocates it, so that it is tracked).
size_t sum_of_squares_scratch(size_t n);
// out[0] = the mean of x(n) (ops::mean), one block summing in double in a
// fixed order (the same bits every run); n >= 1.
void mean(float* out, const float* x, size_t n, cudaStream_t stream);
void sum_of_squares(double* out, double* scratch, const float* grads, size_t n,
                    cudaStream_t stream);
// grads *= factor (clipping to a known global norm).
void scale(float* grads, size_t n, float factor, cudaStream_t stream);

// ---- quantized weights (quant/formats.h) ----------------------------------------
// out(n, local_cols) = local rows [i0, i0 + n) of the quantized matrix W of
// `w`, dequantized, row-major: quant::dequantize_rows on the GPU, with the
// same split of W over the tensor-parallel ranks (quant/qlinear.h). The
// pointers of w.t (data, absmax, absmax_q, absmax2, offset: those its type
// has) are device memory, which the caller has uploaded; R, K and the split
// are read on the host. f32, int8 and nf4; the bits equal those of the CPU
// reference (tests/cuda/test_cuda_quant.cpp), for the reason given in
// cuda/quant.cu. n may be 0 (nothing is launched). Throws RankError for a
// range outside the local matrix, a split that does not divide evenly (as
// make_qslice checks) or a null pointer.
void dequantize_rows(const quant::QSlice& w, int64_t i0, int64_t n, float* out,
                     cudaStream_t stream);
// A lookup in a quantized table (quant::Dequantizer::lookup): row r of
// out(N, local_cols) is local row ids[r] - first of w, dequantized, when
// that lies in [0, local_rows), else zeros. ids is device memory. The same
// checks and bits as dequantize_rows; N may be 0.
void dequantize_lookup(float* out, const int32_t* ids, int N, const quant::QSlice& w,
                       int64_t first, cudaStream_t stream);

}  // namespace meshlm::cuda
