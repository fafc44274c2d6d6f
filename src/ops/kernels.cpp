// Kernels::cpu(): the CPU ops of ops/ops.h behind the Kernels interface.
#include "ops/kernels.h"

#include <algorithm>
#include <cstring>

#include "ops/blas.h"
#include "ops/ops.h"

namespace meshlm::ops {

namespace {

class CpuKernels final : public Kernels {
public:
  explicit CpuKernels(Precision p) : p_(p) {}
  Device device() const override { return Device::cpu; }
  Precision precision() const override { return p_; }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte_part, int N, int C,
                         int v0, int Vl) const override {
    ops::embedding_forward(out, tokens, wte_part, N, C, v0, Vl);
  }
  void embedding_backward(float* dwte_part, const float* dout, const int32_t* tokens, int N, int C,
                          int v0, int Vl) const override {
    ops::embedding_backward(dwte_part, dout, tokens, N, C, v0, Vl);
  }
  void position_forward(float* out, const float* wpe, int B, int Tn, int C) const override {
    ops::position_forward(out, wpe, B, Tn, C);
  }
  void position_backward(float* dwpe, const float* dout, int B, int Tn, int C) const override {
    ops::position_backward(dwpe, dout, B, Tn, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) const override {
    ops::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* w, const float* bias, int N,
                                  int C) const override {
    ops::residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    ops::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N,
                      int IC, int OC) const override {
    ops::matmul_forward(out, inp, w, bias, N, IC, OC, p_);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int IC, int OC) const override {
    ops::matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC, p_);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int Tn, int C,
                         int NH) const override {
    ops::attention_forward(out, att, qkv, B, Tn, C, NH, p_);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, int B, int Tn, int C, int NH) const override {
    ops::attention_backward(dqkv, datt, dout, qkv, att, B, Tn, C, NH, p_);
  }
  bool supports_flash_attention(int) const override { return true; }
  void flash_attention_forward(float* out, float* lse, const float* qkv, int B, int Tn, int C,
                               int NH) const override {
    ops::flash_attention_forward(out, lse, qkv, B, Tn, C, NH, p_);
  }
  void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* out,
                                const float* qkv, const float* lse, int B, int Tn, int C,
                                int NH) const override {
    ops::flash_attention_backward(dqkv, delta, dout, out, qkv, lse, B, Tn, C, NH, p_);
  }
  void gelu_forward(float* out, const float* inp, size_t n) const override {
    ops::gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const override {
    ops::gelu_backward(dinp, inp, dout, n);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       double eps) const override {
    ops::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int N, int C) const override {
    ops::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                const float* b, const float* w, int N, int C,
                                double eps) const override {
    ops::residual_rmsnorm_forward(res, out, rstd, a, b, w, N, C, eps);
  }
  void rope_forward(float* x, const float* cos, const float* sin, int B, int Tn, int heads, int HS,
                    size_t ld) const override {
    ops::rope_forward(x, cos, sin, B, Tn, heads, HS, ld);
  }
  void rope_backward(float* dx, const float* cos, const float* sin, int B, int Tn, int heads,
                     int HS, size_t ld) const override {
    ops::rope_backward(dx, cos, sin, B, Tn, heads, HS, ld);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, int N, int F,
                      size_t ld) const override {
    ops::swiglu_forward(out, gate, up, N, F, ld);
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, int N, int F, size_t ld) const override {
    ops::swiglu_backward(dgate, dup, dout, gate, up, N, F, ld);
  }
  void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int N, int NH,
                        int NKV, int HS, ops::GqaMap m) const override {
    ops::gqa_pack_forward(qkv, q, k, v, N, NH, NKV, HS, m);
  }
  void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int N, int NH,
                         int NKV, int HS, ops::GqaMap m) const override {
    ops::gqa_pack_backward(dq, dk, dv, dqkv, N, NH, NKV, HS, m);
  }
  size_t cached_attention_scratch(int n, int keys, int) const override {
    return ops::cached_attention_scratch(n, keys, omp_get_max_threads());
  }
  void cached_attention_forward(float* out, float* kc, float* vc, const float* q, size_t ldq,
                                const float* k, const float* v, size_t ldkv, int n, int p0, int NH,
                                int NKV, int HS, float* scratch,
                                size_t scratch_floats) const override {
    ops::cached_attention_forward(out, kc, vc, q, ldq, k, v, ldkv, n, p0, NH, NKV, HS, scratch,
                                  scratch_floats, p_);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    ops::residual_forward(out, a, b, n);
  }
  void residual_backward(float* da, float* db, const float* dout, size_t n) const override {
    ops::residual_backward(da, db, dout, n);
  }
  void xent_local_max(float* rowmax, const float* logits, int N, int Vl, int v0,
                      int V) const override {
    ops::xent_local_max(rowmax, logits, N, Vl, v0, V);
  }
  void xent_local_sums(float* sums, const float* logits, const float* rowmax,
                       const int32_t* targets, int N, int Vl, int v0, int V) const override {
    ops::xent_local_sums(sums, logits, rowmax, targets, N, Vl, v0, V);
  }
  void xent_losses(float* losses, const float* rowmax, const float* sums, int N) const override {
    ops::xent_losses(losses, rowmax, sums, N);
  }
  void xent_local_backward(float* logits_dlogits, const float* rowmax, const float* sums,
                           const float* dlosses, const int32_t* targets, int N, int Vl, int v0,
                           int V) const override {
    ops::xent_local_backward(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, v0, V);
  }
  void xent_rows(float* logits_dlogits, float* rowmax, float* sums, const float* dlosses,
                 const int32_t* targets, int N, int Vl, int V) const override {
    ops::xent_rows(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, V);
  }
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) const override {
    ops::gemm(p_, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void zero(float* x, size_t n) const override {
    if (n > 0) std::memset(x, 0, n * sizeof(float));
  }
  void add(float* y, const float* x, size_t n) const override {
    for (size_t i = 0; i < n; ++i) y[i] += x[i];
  }
  void copy(float* dst, const float* src, size_t n) const override {
    if (n > 0) std::memcpy(dst, src, n * sizeof(float));
  }
  void add_bias(float* out, const float* bias, int N, int C) const override {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      float* o = out + static_cast<size_t>(n) * C;
      for (int c = 0; c < C; ++c) o[c] += bias[c];
    }
  }
  void fill(float* x, float value, size_t n) const override { std::fill(x, x + n, value); }
  void upload(void* dst, const void* host_src, size_t bytes) const override {
    if (bytes > 0) std::memcpy(dst, host_src, bytes);
  }
  void download(void* host_dst, const void* src, size_t bytes) const override {
    if (bytes > 0) std::memcpy(host_dst, src, bytes);
  }
  void synchronize() const override {}
  void adamw_update(float* params, const float* grads, float* m, float* v,
                    std::span<const AdamWSegment> segments, const AdamWHyper& h) const override {
    ops::adamw_update(params, grads, m, v, segments, h);
  }
  double sum_of_squares(const float* x, size_t n) const override {
    return ops::sum_of_squares(x, n);
  }
  void scale(float* x, float factor, size_t n) const override { ops::scale(x, factor, n); }
  void mean(float* out, const float* x, size_t n) const override { ops::mean(out, x, n); }

private:
  Precision p_;
};

}  // namespace

const Kernels& Kernels::cpu(Precision p) {
  static const CpuKernels fp32(Precision::fp32), bf16(Precision::bf16), fp16(Precision::fp16);
  switch (p) {
    case Precision::bf16: return bf16;
    case Precision::fp16: return fp16;
    case Precision::fp32: break;
  }
  return fp32;
}

}  // namespace meshlm::ops
