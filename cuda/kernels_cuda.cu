// cuda::make_kernels: cuda/ops_cuda.h behind the ops::Kernels interface.
#include "cuda/kernels_cuda.h"

#include <cuda_runtime.h>

#include "cuda/blas.cuh"
#include "cuda/cuda_check.cuh"

namespace meshlm::cuda {

namespace {

class CudaKernels final : public ops::Kernels {
public:
  explicit CudaKernels(cudaStream_t stream) : s_(stream) {}
  Device device() const override { return Device::cuda; }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte_part, int N, int C,
                         int v0, int Vl) const override {
    cuda::embedding_forward(out, tokens, wte_part, N, C, v0, Vl, s_);
  }
  void embedding_backward(float* dwte_part, const float* dout, const int32_t* tokens, int N, int C,
                          int v0, int Vl) const override {
    cuda::embedding_backward(dwte_part, dout, tokens, N, C, v0, Vl, s_);
  }
  void position_forward(float* out, const float* wpe, int B, int Tn, int C) const override {
    cuda::position_forward(out, wpe, B, Tn, C, s_);
  }
  void position_backward(float* dwpe, const float* dout, int B, int Tn, int C) const override {
    cuda::position_backward(dwpe, dout, B, Tn, C, s_);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) const override {
    cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, s_);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, s_);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N,
                      int IC, int OC) const override {
    cuda::matmul_forward(out, inp, w, bias, N, IC, OC, s_);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int IC, int OC) const override {
    cuda::matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC, s_);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int Tn, int C,
                         int NH) const override {
    cuda::attention_forward(out, att, qkv, B, Tn, C, NH, s_);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, int B, int Tn, int C, int NH) const override {
    cuda::attention_backward(dqkv, datt, dout, qkv, att, B, Tn, C, NH, s_);
  }
  void gelu_forward(float* out, const float* inp, size_t n) const override {
    cuda::gelu_forward(out, inp, n, s_);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const override {
    cuda::gelu_backward(dinp, inp, dout, n, s_);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    cuda::residual_forward(out, a, b, n, s_);
  }
  void residual_backward(float* da, float* db, const float* dout, size_t n) const override {
    cuda::residual_backward(da, db, dout, n, s_);
  }
  void xent_local_max(float* rowmax, const float* logits, int N, int Vl, int v0,
                      int V) const override {
    cuda::xent_local_max(rowmax, logits, N, Vl, v0, V, s_);
  }
  void xent_local_sums(float* sums, const float* logits, const float* rowmax,
                       const int32_t* targets, int N, int Vl, int v0, int V) const override {
    cuda::xent_local_sums(sums, logits, rowmax, targets, N, Vl, v0, V, s_);
  }
  void xent_losses(float* losses, const float* rowmax, const float* sums, int N) const override {
    cuda::xent_losses(losses, rowmax, sums, N, s_);
  }
  void xent_local_backward(float* logits_dlogits, const float* rowmax, const float* sums,
                           const float* dlosses, const int32_t* targets, int N, int Vl, int v0,
                           int V) const override {
    cuda::xent_local_backward(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, v0, V, s_);
  }
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) const override {
    gemm_rm(s_, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void zero(float* x, size_t n) const override {
    if (n > 0) CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), s_));
  }
  void add(float* y, const float* x, size_t n) const override { cuda::add(y, x, n, s_); }
  void add_bias(float* out, const float* bias, int N, int C) const override {
    cuda::add_bias(out, bias, N, C, s_);
  }

private:
  cudaStream_t s_;
};

}  // namespace

std::unique_ptr<ops::Kernels> make_kernels(cudaStream_t stream) {
  return std::make_unique<CudaKernels>(stream);
}

}  // namespace meshlm::cuda
