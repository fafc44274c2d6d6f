// The CUDA implementation of the ops interface of src/ops/ops.h.
//
// Each op here has the semantics of its CPU namesake in meshlm::ops, which is
// the reference it is tested against (tests/cuda/): same argument order,
// same shapes (dimension letters as in src/ops/ops.h), same conventions:
//   * Forward ops overwrite their outputs.
//   * Backward ops ACCUMULATE (+=) into every gradient they write.
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

// ---- GELU, tanh approximation (as GPT-2) --------------------------------------
// out(n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x = inp(n).
// out may equal inp (in place); otherwise the arrays must not overlap. n may
// be 0 (nothing is launched). Any n and any float alignment: 16-byte aligned
// arrays take the float4 path. Agrees with ops::gelu_forward<float> to a few
// 1e-7 of |out| + |x| (tests/cuda/test_cuda_gelu.cpp explains the scale):
// tanh is computed to full float precision although the CUDA library is
// built with --use_fast_math (see cuda/gelu.cu).
void gelu_forward(float* out, const float* inp, size_t n, cudaStream_t stream);
// dinp(n) += gelu'(inp) * dout(n); inp is the forward INPUT (x), not out.
// dinp must not overlap inp or dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                   cudaStream_t stream);

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

}  // namespace meshlm::cuda
