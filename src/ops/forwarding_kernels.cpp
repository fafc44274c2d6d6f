#include "ops/forwarding_kernels.h"

#include <iterator>

namespace meshlm::ops {

const char* kernel_op_name(KernelOp op) {
  static const char* const kNames[] = {
      "embedding_forward", "embedding_backward", "position_forward", "position_backward",
      "layernorm_forward", "layernorm_backward", "residual_layernorm_forward",
      "matmul_forward", "matmul_backward",
      "attention_forward", "attention_backward", "flash_attention_forward",
      "flash_attention_backward", "gelu_forward", "gelu_backward", "rmsnorm_forward",
      "rmsnorm_backward", "residual_rmsnorm_forward", "rope_forward", "rope_backward", "swiglu_forward", "swiglu_backward",
      "gqa_pack_forward", "gqa_pack_backward", "cached_attention_forward", "residual_forward",
      "residual_backward", "xent_local_max", "xent_local_sums", "xent_losses",
      "xent_local_backward", "xent_rows", "gemm", "hold_rounded", "zero", "add", "add_bias",
      "fill", "copy", "upload", "download", "adamw_update", "sum_of_squares", "scale", "mean"};
  static_assert(std::size(kNames) == static_cast<size_t>(KernelOp::count));
  return kNames[static_cast<int>(op)];
}

namespace {

// 4-byte elements.
constexpr double kF = 4;

OpWork mem(double elements) { return {0, kF * elements}; }

OpWork matmul(double N, double IC, double OC, bool backward) {
  // Forward: out = inp w^T (+ bias). Backward: dinp = dout w, dw += dout^T inp
  // (+ dbias): two products, reading dout, inp and w, writing dinp and dw.
  const double once = N * IC + IC * OC + N * OC;
  return backward ? OpWork{4 * N * IC * OC, kF * (once + N * IC + IC * OC)}
                  : OpWork{2 * N * IC * OC, kF * once};
}

// Attention over the whole T x T score matrix, as the step's FLOP count takes
// it (docs/PERFORMANCE.md: 4 T C per token forward), and the scores written
// (probabilities) or not (flash).
OpWork attention(double B, double T, double C, double NH, bool scores, double passes) {
  return {passes * 4 * B * T * T * C, kF * (4 * B * T * C + (scores ? B * NH * T * T : 0))};
}

}  // namespace

void ForwardingKernels::embedding_forward(float* out, const int32_t* tokens, const float* wte_part,
                                          int N, int C, int v0, int Vl) const {
  const auto body = [&] { inner_.embedding_forward(out, tokens, wte_part, N, C, v0, Vl); };
  around(KernelOp::embedding_forward, mem(2.0 * N * C), nullptr, body);
}

void ForwardingKernels::embedding_backward(float* dwte_part, const float* dout,
                                           const int32_t* tokens, int N, int C, int v0,
                                           int Vl) const {
  const auto body = [&] { inner_.embedding_backward(dwte_part, dout, tokens, N, C, v0, Vl); };
  around(KernelOp::embedding_backward, mem(2.0 * N * C), nullptr, body);
}

void ForwardingKernels::position_forward(float* out, const float* wpe, int B, int Tn, int C) const {
  const auto body = [&] { inner_.position_forward(out, wpe, B, Tn, C); };
  around(KernelOp::position_forward, mem(2.0 * B * Tn * C), nullptr, body);
}

void ForwardingKernels::position_backward(float* dwpe, const float* dout, int B, int Tn,
                                          int C) const {
  const auto body = [&] { inner_.position_backward(dwpe, dout, B, Tn, C); };
  around(KernelOp::position_backward, mem(2.0 * B * Tn * C), nullptr, body);
}

void ForwardingKernels::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                          const float* w, const float* b, int N, int C) const {
  const auto body = [&] { inner_.layernorm_forward(out, mean, rstd, inp, w, b, N, C); };
  around(KernelOp::layernorm_forward, mem(2.0 * N * C), nullptr, body);
}

void ForwardingKernels::residual_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                                   const float* a, const float* b, const float* w,
                                                   const float* bias, int N, int C) const {
  const auto body = [&] {
    inner_.residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C);
  };
  around(KernelOp::residual_layernorm_forward, mem(4.0 * N * C), nullptr, body);
}

void ForwardingKernels::layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                           const float* inp, const float* w, const float* mean,
                                           const float* rstd, int N, int C) const {
  const auto body = [&] {
    inner_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  };
  around(KernelOp::layernorm_backward, mem(3.0 * N * C), nullptr, body);
}

void ForwardingKernels::matmul_forward(float* out, const float* inp, const float* w,
                                       const float* bias, int N, int IC, int OC) const {
  const GemmShape shape{KernelOp::matmul_forward, N, OC, IC};
  const auto body = [&] { inner_.matmul_forward(out, inp, w, bias, N, IC, OC); };
  around(KernelOp::matmul_forward, matmul(N, IC, OC, false), &shape, body);
}

void ForwardingKernels::matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                                        const float* inp, const float* w, int N, int IC,
                                        int OC) const {
  const GemmShape shape{KernelOp::matmul_backward, N, OC, IC};
  const auto body = [&] { inner_.matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC); };
  around(KernelOp::matmul_backward, matmul(N, IC, OC, true), &shape, body);
}

void ForwardingKernels::attention_forward(float* out, float* att, const float* qkv, int B, int Tn,
                                          int C, int NH) const {
  const auto body = [&] { inner_.attention_forward(out, att, qkv, B, Tn, C, NH); };
  around(KernelOp::attention_forward, attention(B, Tn, C, NH, true, 1), nullptr, body);
}

void ForwardingKernels::attention_backward(float* dqkv, float* datt, const float* dout,
                                           const float* qkv, const float* att, int B, int Tn, int C,
                                           int NH) const {
  const auto body = [&] { inner_.attention_backward(dqkv, datt, dout, qkv, att, B, Tn, C, NH); };
  around(KernelOp::attention_backward, attention(B, Tn, C, NH, true, 2), nullptr, body);
}

void ForwardingKernels::flash_attention_forward(float* out, float* lse, const float* qkv, int B,
                                                int Tn, int C, int NH) const {
  const auto body = [&] { inner_.flash_attention_forward(out, lse, qkv, B, Tn, C, NH); };
  around(KernelOp::flash_attention_forward, attention(B, Tn, C, NH, false, 1), nullptr, body);
}

void ForwardingKernels::flash_attention_backward(float* dqkv, float* delta, const float* dout,
                                                 const float* out, const float* qkv,
                                                 const float* lse, int B, int Tn, int C,
                                                 int NH) const {
  const auto body = [&] {
    inner_.flash_attention_backward(dqkv, delta, dout, out, qkv, lse, B, Tn, C, NH);
  };
  around(KernelOp::flash_attention_backward, attention(B, Tn, C, NH, false, 2.5), nullptr, body);
}

void ForwardingKernels::gelu_forward(float* out, const float* inp, size_t n) const {
  const auto body = [&] { inner_.gelu_forward(out, inp, n); };
  around(KernelOp::gelu_forward, mem(2.0 * n), nullptr, body);
}

void ForwardingKernels::gelu_backward(float* dinp, const float* inp, const float* dout,
                                      size_t n) const {
  const auto body = [&] { inner_.gelu_backward(dinp, inp, dout, n); };
  around(KernelOp::gelu_backward, mem(3.0 * n), nullptr, body);
}

void ForwardingKernels::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w,
                                        int N, int C, double eps) const {
  const auto body = [&] { inner_.rmsnorm_forward(out, rstd, inp, w, N, C, eps); };
  around(KernelOp::rmsnorm_forward, mem(2.0 * N * C), nullptr, body);
}

void ForwardingKernels::rmsnorm_backward(float* dinp, float* dw, const float* dout,
                                         const float* inp, const float* w, const float* rstd, int N,
                                         int C) const {
  const auto body = [&] { inner_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); };
  around(KernelOp::rmsnorm_backward, mem(3.0 * N * C), nullptr, body);
}

void ForwardingKernels::residual_rmsnorm_forward(float* res, float* out, float* rstd,
                                                 const float* a, const float* b, const float* w,
                                                 int N, int C, double eps) const {
  const auto body = [&] { inner_.residual_rmsnorm_forward(res, out, rstd, a, b, w, N, C, eps); };
  around(KernelOp::residual_rmsnorm_forward, mem(4.0 * N * C), nullptr, body);
}

void ForwardingKernels::rope_forward(float* x, const float* cos, const float* sin, int B, int Tn,
                                     int heads, int HS, size_t ld) const {
  const auto body = [&] { inner_.rope_forward(x, cos, sin, B, Tn, heads, HS, ld); };
  around(KernelOp::rope_forward, mem(2.0 * B * Tn * heads * HS), nullptr, body);
}

void ForwardingKernels::rope_backward(float* dx, const float* cos, const float* sin, int B, int Tn,
                                      int heads, int HS, size_t ld) const {
  const auto body = [&] { inner_.rope_backward(dx, cos, sin, B, Tn, heads, HS, ld); };
  around(KernelOp::rope_backward, mem(2.0 * B * Tn * heads * HS), nullptr, body);
}

void ForwardingKernels::swiglu_forward(float* out, const float* gate, const float* up, int N, int F,
                                       size_t ld) const {
  const auto body = [&] { inner_.swiglu_forward(out, gate, up, N, F, ld); };
  around(KernelOp::swiglu_forward, mem(3.0 * N * F), nullptr, body);
}

void ForwardingKernels::swiglu_backward(float* dgate, float* dup, const float* dout,
                                        const float* gate, const float* up, int N, int F,
                                        size_t ld) const {
  const auto body = [&] { inner_.swiglu_backward(dgate, dup, dout, gate, up, N, F, ld); };
  around(KernelOp::swiglu_backward, mem(5.0 * N * F), nullptr, body);
}

void ForwardingKernels::gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v,
                                         int N, int NH, int NKV, int HS, ops::GqaMap m) const {
  const auto body = [&] { inner_.gqa_pack_forward(qkv, q, k, v, N, NH, NKV, HS, m); };
  around(KernelOp::gqa_pack_forward, mem(2.0 * N * (NH + 2 * NKV) * HS), nullptr, body);
}

void ForwardingKernels::gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int N,
                                          int NH, int NKV, int HS, ops::GqaMap m) const {
  const auto body = [&] { inner_.gqa_pack_backward(dq, dk, dv, dqkv, N, NH, NKV, HS, m); };
  around(KernelOp::gqa_pack_backward, mem(2.0 * N * (NH + 2 * NKV) * HS), nullptr, body);
}

void ForwardingKernels::cached_attention_forward(float* out, float* kc, float* vc, const float* q,
                                                 size_t ldq, const float* k, const float* v,
                                                 size_t ldkv, int n, int p0, int NH, int NKV,
                                                 int HS, float* scratch,
                                                 size_t scratch_floats) const {
  const auto body = [&] {
    inner_.cached_attention_forward(out, kc, vc, q, ldq, k, v, ldkv, n, p0, NH, NKV, HS, scratch,
                                    scratch_floats);
  };
  // Scores and the product with V: 2 multiply-adds per query row, key and
  // channel (the causal half counted whole, as attention() does); q, the
  // keys and values seen, out and the appended rows.
  const double keys = p0 + n, C = double(NH) * HS, Ckv = double(NKV) * HS;
  const OpWork w{4.0 * n * keys * C, kF * (2.0 * n * C + 2.0 * keys * Ckv + 2.0 * n * Ckv)};
  around(KernelOp::cached_attention_forward, w, nullptr, body);
}

void ForwardingKernels::residual_forward(float* out, const float* a, const float* b,
                                         size_t n) const {
  const auto body = [&] { inner_.residual_forward(out, a, b, n); };
  around(KernelOp::residual_forward, mem(3.0 * n), nullptr, body);
}

void ForwardingKernels::residual_backward(float* da, float* db, const float* dout, size_t n) const {
  const auto body = [&] { inner_.residual_backward(da, db, dout, n); };
  around(KernelOp::residual_backward, mem(3.0 * n), nullptr, body);
}

void ForwardingKernels::xent_local_max(float* rowmax, const float* logits, int N, int Vl, int v0,
                                       int V) const {
  const auto body = [&] { inner_.xent_local_max(rowmax, logits, N, Vl, v0, V); };
  around(KernelOp::xent_local_max, mem(1.0 * N * Vl), nullptr, body);
}

void ForwardingKernels::xent_local_sums(float* sums, const float* logits, const float* rowmax,
                                        const int32_t* targets, int N, int Vl, int v0,
                                        int V) const {
  const auto body = [&] { inner_.xent_local_sums(sums, logits, rowmax, targets, N, Vl, v0, V); };
  around(KernelOp::xent_local_sums, mem(1.0 * N * Vl), nullptr, body);
}

void ForwardingKernels::xent_losses(float* losses, const float* rowmax, const float* sums,
                                    int N) const {
  const auto body = [&] { inner_.xent_losses(losses, rowmax, sums, N); };
  around(KernelOp::xent_losses, mem(3.0 * N), nullptr, body);
}

void ForwardingKernels::xent_local_backward(float* logits_dlogits, const float* rowmax,
                                            const float* sums, const float* dlosses,
                                            const int32_t* targets, int N, int Vl, int v0,
                                            int V) const {
  const auto body = [&] {
    inner_.xent_local_backward(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, v0, V);
  };
  around(KernelOp::xent_local_backward, mem(2.0 * N * Vl), nullptr, body);
}

void ForwardingKernels::xent_rows(float* logits_dlogits, float* rowmax, float* sums,
                                  const float* dlosses, const int32_t* targets, int N, int Vl,
                                  int V) const {
  const auto body = [&] {
    inner_.xent_rows(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, V);
  };
  around(KernelOp::xent_rows, mem(2.0 * N * Vl), nullptr, body);
}

void ForwardingKernels::hold_rounded(const float* x, size_t n) const {
  // fp32 rounds nothing: no work.
  const OpWork w = inner_.precision() == Precision::fp32 ? OpWork{} : mem(2.0 * n);
  const auto body = [&] { inner_.hold_rounded(x, n); };
  around(KernelOp::hold_rounded, w, nullptr, body);
}

void ForwardingKernels::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                             int lda, const float* B, int ldb, float beta, float* C,
                             int ldc) const {
  const GemmShape shape{KernelOp::gemm, M, N, K};
  const double m = M, n = N, k = K;
  const auto body = [&] { inner_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); };
  around(KernelOp::gemm, OpWork{2 * m * n * k, kF * (m * k + k * n + 2 * m * n)}, &shape, body);
}

void ForwardingKernels::zero(float* x, size_t n) const {
  const auto body = [&] { inner_.zero(x, n); };
  around(KernelOp::zero, mem(1.0 * n), nullptr, body);
}

void ForwardingKernels::add(float* y, const float* x, size_t n) const {
  const auto body = [&] { inner_.add(y, x, n); };
  around(KernelOp::add, mem(3.0 * n), nullptr, body);
}

void ForwardingKernels::add_bias(float* out, const float* bias, int N, int C) const {
  const auto body = [&] { inner_.add_bias(out, bias, N, C); };
  around(KernelOp::add_bias, mem(2.0 * N * C), nullptr, body);
}

void ForwardingKernels::fill(float* x, float value, size_t n) const {
  const auto body = [&] { inner_.fill(x, value, n); };
  around(KernelOp::fill, mem(1.0 * n), nullptr, body);
}

void ForwardingKernels::copy(float* dst, const float* src, size_t n) const {
  const auto body = [&] { inner_.copy(dst, src, n); };
  around(KernelOp::copy, mem(2.0 * n), nullptr, body);
}

void ForwardingKernels::upload(void* dst, const void* host_src, size_t bytes) const {
  const auto body = [&] { inner_.upload(dst, host_src, bytes); };
  around(KernelOp::upload, OpWork{0, static_cast<double>(bytes)}, nullptr, body);
}

void ForwardingKernels::download(void* host_dst, const void* src, size_t bytes) const {
  const auto body = [&] { inner_.download(host_dst, src, bytes); };
  around(KernelOp::download, OpWork{0, static_cast<double>(bytes)}, nullptr, body);
}

void ForwardingKernels::adamw_update(float* params, const float* grads, float* m, float* v,
                                     std::span<const AdamWSegment> segments,
                                     const AdamWHyper& h) const {
  double n = 0;
  for (const AdamWSegment& seg : segments) n += static_cast<double>(seg.count);
  // Reads p, g, m, v; writes p, m, v.
  const auto body = [&] { inner_.adamw_update(params, grads, m, v, segments, h); };
  around(KernelOp::adamw_update, mem(7 * n), nullptr, body);
}

void ForwardingKernels::sums_of_squares(std::span<const Span> spans, double* out) const {
  double n = 0;
  for (const Span& sp : spans) n += static_cast<double>(sp.second);
  const auto body = [&] { inner_.sums_of_squares(spans, out); };
  around(KernelOp::sum_of_squares, OpWork{2 * n, kF * n}, nullptr, body);
}

double ForwardingKernels::sum_of_squares(const float* x, size_t n) const {
  double r = 0;
  const auto body = [&] { r = inner_.sum_of_squares(x, n); };
  around(KernelOp::sum_of_squares, OpWork{2.0 * n, kF * n}, nullptr, body);
  return r;
}

void ForwardingKernels::scale(float* x, float factor, size_t n) const {
  const auto body = [&] { inner_.scale(x, factor, n); };
  around(KernelOp::scale, mem(2.0 * n), nullptr, body);
}

void ForwardingKernels::mean(float* out, const float* x, size_t n) const {
  const auto body = [&] { inner_.mean(out, x, n); };
  around(KernelOp::mean, mem(n + 1.0), nullptr, body);
}

}  // namespace meshlm::ops
