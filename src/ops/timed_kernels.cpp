#include "ops/timed_kernels.h"

#include <iterator>

#include "core/timer.h"

namespace meshlm::ops {

const char* kernel_op_name(KernelOp op) {
  static const char* const kNames[] = {
      "embedding_forward", "embedding_backward", "position_forward", "position_backward",
      "layernorm_forward", "layernorm_backward", "residual_layernorm_forward",
      "matmul_forward", "matmul_backward",
      "attention_forward", "attention_backward", "flash_attention_forward",
      "flash_attention_backward", "gelu_forward", "gelu_backward", "rmsnorm_forward",
      "rmsnorm_backward", "rope_forward", "rope_backward", "swiglu_forward", "swiglu_backward",
      "gqa_pack_forward", "gqa_pack_backward", "residual_forward",
      "residual_backward", "xent_local_max", "xent_local_sums", "xent_losses",
      "xent_local_backward", "xent_rows", "gemm", "hold_rounded", "zero", "add", "add_bias",
      "fill", "upload", "download", "adamw_update", "sum_of_squares", "scale"};
  static_assert(std::size(kNames) == static_cast<size_t>(KernelOp::count));
  return kNames[static_cast<int>(op)];
}

template <typename F>
void TimedKernels::timed(KernelOp op, F&& f) const {
  inner_.synchronize();
  const double t0 = now_seconds();
  f();
  inner_.synchronize();
  seconds_[static_cast<int>(op)] += now_seconds() - t0;
  ++calls_[static_cast<int>(op)];
}

void TimedKernels::embedding_forward(float* out, const int32_t* tokens, const float* wte_part,
                                     int N, int C, int v0, int Vl) const {
  timed(KernelOp::embedding_forward,
        [&] { inner_.embedding_forward(out, tokens, wte_part, N, C, v0, Vl); });
}

void TimedKernels::embedding_backward(float* dwte_part, const float* dout, const int32_t* tokens,
                                      int N, int C, int v0, int Vl) const {
  timed(KernelOp::embedding_backward,
        [&] { inner_.embedding_backward(dwte_part, dout, tokens, N, C, v0, Vl); });
}

void TimedKernels::position_forward(float* out, const float* wpe, int B, int Tn, int C) const {
  timed(KernelOp::position_forward, [&] { inner_.position_forward(out, wpe, B, Tn, C); });
}

void TimedKernels::position_backward(float* dwpe, const float* dout, int B, int Tn, int C) const {
  timed(KernelOp::position_backward, [&] { inner_.position_backward(dwpe, dout, B, Tn, C); });
}

void TimedKernels::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                     const float* w, const float* b, int N, int C) const {
  timed(KernelOp::layernorm_forward,
        [&] { inner_.layernorm_forward(out, mean, rstd, inp, w, b, N, C); });
}

void TimedKernels::residual_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                              const float* a, const float* b, const float* w,
                                              const float* bias, int N, int C) const {
  timed(KernelOp::residual_layernorm_forward,
        [&] { inner_.residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C); });
}

void TimedKernels::layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                      const float* inp, const float* w, const float* mean,
                                      const float* rstd, int N, int C) const {
  timed(KernelOp::layernorm_backward,
        [&] { inner_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
}

void TimedKernels::matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                                  int N, int IC, int OC) const {
  timed(KernelOp::matmul_forward, [&] { inner_.matmul_forward(out, inp, w, bias, N, IC, OC); });
}

void TimedKernels::matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                                   const float* inp, const float* w, int N, int IC, int OC) const {
  timed(KernelOp::matmul_backward,
        [&] { inner_.matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC); });
}

void TimedKernels::attention_forward(float* out, float* att, const float* qkv, int B, int Tn, int C,
                                     int NH) const {
  timed(KernelOp::attention_forward,
        [&] { inner_.attention_forward(out, att, qkv, B, Tn, C, NH); });
}

void TimedKernels::attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                                      const float* att, int B, int Tn, int C, int NH) const {
  timed(KernelOp::attention_backward,
        [&] { inner_.attention_backward(dqkv, datt, dout, qkv, att, B, Tn, C, NH); });
}

void TimedKernels::flash_attention_forward(float* out, float* lse, const float* qkv, int B, int Tn,
                                           int C, int NH) const {
  timed(KernelOp::flash_attention_forward,
        [&] { inner_.flash_attention_forward(out, lse, qkv, B, Tn, C, NH); });
}

void TimedKernels::flash_attention_backward(float* dqkv, float* delta, const float* dout,
                                            const float* out, const float* qkv, const float* lse,
                                            int B, int Tn, int C, int NH) const {
  timed(KernelOp::flash_attention_backward,
        [&] { inner_.flash_attention_backward(dqkv, delta, dout, out, qkv, lse, B, Tn, C, NH); });
}

void TimedKernels::gelu_forward(float* out, const float* inp, size_t n) const {
  timed(KernelOp::gelu_forward, [&] { inner_.gelu_forward(out, inp, n); });
}

void TimedKernels::gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const {
  timed(KernelOp::gelu_backward, [&] { inner_.gelu_backward(dinp, inp, dout, n); });
}

void TimedKernels::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w,
                                   int N, int C, double eps) const {
  timed(KernelOp::rmsnorm_forward, [&] { inner_.rmsnorm_forward(out, rstd, inp, w, N, C, eps); });
}

void TimedKernels::rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                    const float* w, const float* rstd, int N, int C) const {
  timed(KernelOp::rmsnorm_backward,
        [&] { inner_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); });
}

void TimedKernels::rope_forward(float* x, const float* cos, const float* sin, int B, int Tn,
                                int heads, int HS, size_t ld) const {
  timed(KernelOp::rope_forward, [&] { inner_.rope_forward(x, cos, sin, B, Tn, heads, HS, ld); });
}

void TimedKernels::rope_backward(float* dx, const float* cos, const float* sin, int B, int Tn,
                                 int heads, int HS, size_t ld) const {
  timed(KernelOp::rope_backward, [&] { inner_.rope_backward(dx, cos, sin, B, Tn, heads, HS, ld); });
}

void TimedKernels::swiglu_forward(float* out, const float* gate, const float* up, int N, int F,
                                  size_t ld) const {
  timed(KernelOp::swiglu_forward, [&] { inner_.swiglu_forward(out, gate, up, N, F, ld); });
}

void TimedKernels::swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                   const float* up, int N, int F, size_t ld) const {
  timed(KernelOp::swiglu_backward,
        [&] { inner_.swiglu_backward(dgate, dup, dout, gate, up, N, F, ld); });
}

void TimedKernels::gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v,
                                    int N, int NH, int NKV, int HS, ops::GqaMap m) const {
  timed(KernelOp::gqa_pack_forward,
        [&] { inner_.gqa_pack_forward(qkv, q, k, v, N, NH, NKV, HS, m); });
}

void TimedKernels::gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int N,
                                     int NH, int NKV, int HS, ops::GqaMap m) const {
  timed(KernelOp::gqa_pack_backward,
        [&] { inner_.gqa_pack_backward(dq, dk, dv, dqkv, N, NH, NKV, HS, m); });
}

void TimedKernels::residual_forward(float* out, const float* a, const float* b, size_t n) const {
  timed(KernelOp::residual_forward, [&] { inner_.residual_forward(out, a, b, n); });
}

void TimedKernels::residual_backward(float* da, float* db, const float* dout, size_t n) const {
  timed(KernelOp::residual_backward, [&] { inner_.residual_backward(da, db, dout, n); });
}

void TimedKernels::xent_local_max(float* rowmax, const float* logits, int N, int Vl, int v0,
                                  int V) const {
  timed(KernelOp::xent_local_max, [&] { inner_.xent_local_max(rowmax, logits, N, Vl, v0, V); });
}

void TimedKernels::xent_local_sums(float* sums, const float* logits, const float* rowmax,
                                   const int32_t* targets, int N, int Vl, int v0, int V) const {
  timed(KernelOp::xent_local_sums,
        [&] { inner_.xent_local_sums(sums, logits, rowmax, targets, N, Vl, v0, V); });
}

void TimedKernels::xent_losses(float* losses, const float* rowmax, const float* sums, int N) const {
  timed(KernelOp::xent_losses, [&] { inner_.xent_losses(losses, rowmax, sums, N); });
}

void TimedKernels::xent_local_backward(float* logits_dlogits, const float* rowmax,
                                       const float* sums, const float* dlosses,
                                       const int32_t* targets, int N, int Vl, int v0, int V) const {
  timed(KernelOp::xent_local_backward, [&] {
    inner_.xent_local_backward(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, v0, V);
  });
}

void TimedKernels::xent_rows(float* logits_dlogits, float* rowmax, float* sums,
                             const float* dlosses, const int32_t* targets, int N, int Vl,
                             int V) const {
  timed(KernelOp::xent_rows,
        [&] { inner_.xent_rows(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, V); });
}

void TimedKernels::hold_rounded(const float* x, size_t n) const {
  timed(KernelOp::hold_rounded, [&] { inner_.hold_rounded(x, n); });
}

void TimedKernels::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                        const float* B, int ldb, float beta, float* C, int ldc) const {
  timed(KernelOp::gemm, [&] { inner_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); });
}

void TimedKernels::zero(float* x, size_t n) const {
  timed(KernelOp::zero, [&] { inner_.zero(x, n); });
}

void TimedKernels::add(float* y, const float* x, size_t n) const {
  timed(KernelOp::add, [&] { inner_.add(y, x, n); });
}

void TimedKernels::add_bias(float* out, const float* bias, int N, int C) const {
  timed(KernelOp::add_bias, [&] { inner_.add_bias(out, bias, N, C); });
}

void TimedKernels::fill(float* x, float value, size_t n) const {
  timed(KernelOp::fill, [&] { inner_.fill(x, value, n); });
}

void TimedKernels::upload(void* dst, const void* host_src, size_t bytes) const {
  timed(KernelOp::upload, [&] { inner_.upload(dst, host_src, bytes); });
}

void TimedKernels::download(void* host_dst, const void* src, size_t bytes) const {
  timed(KernelOp::download, [&] { inner_.download(host_dst, src, bytes); });
}

void TimedKernels::adamw_update(float* params, const float* grads, float* m, float* v,
                                std::span<const AdamWSegment> segments, const AdamWHyper& h) const {
  timed(KernelOp::adamw_update, [&] { inner_.adamw_update(params, grads, m, v, segments, h); });
}

void TimedKernels::sums_of_squares(std::span<const Span> spans, double* out) const {
  timed(KernelOp::sum_of_squares, [&] { inner_.sums_of_squares(spans, out); });
}

double TimedKernels::sum_of_squares(const float* x, size_t n) const {
  double r = 0;
  timed(KernelOp::sum_of_squares, [&] { r = inner_.sum_of_squares(x, n); });
  return r;
}

void TimedKernels::scale(float* x, float factor, size_t n) const {
  timed(KernelOp::scale, [&] { inner_.scale(x, factor, n); });
}

}  // namespace meshlm::ops
