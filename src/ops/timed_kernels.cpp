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

template <typename F>
void TimedKernels::timed(KernelOp op, OpWork w, F&& f, const GemmShape* shape) const {
  inner_.synchronize();
  const double t0 = now_seconds();
  f();
  inner_.synchronize();
  const double dt = now_seconds() - t0;
  const int i = static_cast<int>(op);
  seconds_[i] += dt;
  ++calls_[i];
  work_[i].flops += w.flops;
  work_[i].bytes += w.bytes;
  if (shape) {
    GemmStat& g = shapes_[*shape];
    g.seconds += dt;
    g.flops += w.flops;
    ++g.calls;
  }
}

void TimedKernels::embedding_forward(float* out, const int32_t* tokens, const float* wte_part,
                                     int N, int C, int v0, int Vl) const {
  timed(KernelOp::embedding_forward, mem(2.0 * N * C),
        [&] { inner_.embedding_forward(out, tokens, wte_part, N, C, v0, Vl); });
}

void TimedKernels::embedding_backward(float* dwte_part, const float* dout, const int32_t* tokens,
                                      int N, int C, int v0, int Vl) const {
  timed(KernelOp::embedding_backward, mem(2.0 * N * C),
        [&] { inner_.embedding_backward(dwte_part, dout, tokens, N, C, v0, Vl); });
}

void TimedKernels::position_forward(float* out, const float* wpe, int B, int Tn, int C) const {
  timed(KernelOp::position_forward, mem(2.0 * B * Tn * C),
        [&] { inner_.position_forward(out, wpe, B, Tn, C); });
}

void TimedKernels::position_backward(float* dwpe, const float* dout, int B, int Tn, int C) const {
  timed(KernelOp::position_backward, mem(2.0 * B * Tn * C),
        [&] { inner_.position_backward(dwpe, dout, B, Tn, C); });
}

void TimedKernels::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                     const float* w, const float* b, int N, int C) const {
  timed(KernelOp::layernorm_forward, mem(2.0 * N * C),
        [&] { inner_.layernorm_forward(out, mean, rstd, inp, w, b, N, C); });
}

void TimedKernels::residual_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                              const float* a, const float* b, const float* w,
                                              const float* bias, int N, int C) const {
  timed(KernelOp::residual_layernorm_forward, mem(4.0 * N * C),
        [&] { inner_.residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C); });
}

void TimedKernels::layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                      const float* inp, const float* w, const float* mean,
                                      const float* rstd, int N, int C) const {
  timed(KernelOp::layernorm_backward, mem(3.0 * N * C),
        [&] { inner_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
}

void TimedKernels::matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                                  int N, int IC, int OC) const {
  const GemmShape shape{KernelOp::matmul_forward, N, OC, IC};
  timed(KernelOp::matmul_forward, matmul(N, IC, OC, false),
        [&] { inner_.matmul_forward(out, inp, w, bias, N, IC, OC); }, &shape);
}

void TimedKernels::matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                                   const float* inp, const float* w, int N, int IC, int OC) const {
  const GemmShape shape{KernelOp::matmul_backward, N, OC, IC};
  timed(KernelOp::matmul_backward, matmul(N, IC, OC, true),
        [&] { inner_.matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC); }, &shape);
}

void TimedKernels::attention_forward(float* out, float* att, const float* qkv, int B, int Tn, int C,
                                     int NH) const {
  timed(KernelOp::attention_forward, attention(B, Tn, C, NH, true, 1),
        [&] { inner_.attention_forward(out, att, qkv, B, Tn, C, NH); });
}

void TimedKernels::attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                                      const float* att, int B, int Tn, int C, int NH) const {
  timed(KernelOp::attention_backward, attention(B, Tn, C, NH, true, 2),
        [&] { inner_.attention_backward(dqkv, datt, dout, qkv, att, B, Tn, C, NH); });
}

void TimedKernels::flash_attention_forward(float* out, float* lse, const float* qkv, int B, int Tn,
                                           int C, int NH) const {
  timed(KernelOp::flash_attention_forward, attention(B, Tn, C, NH, false, 1),
        [&] { inner_.flash_attention_forward(out, lse, qkv, B, Tn, C, NH); });
}

void TimedKernels::flash_attention_backward(float* dqkv, float* delta, const float* dout,
                                            const float* out, const float* qkv, const float* lse,
                                            int B, int Tn, int C, int NH) const {
  timed(KernelOp::flash_attention_backward, attention(B, Tn, C, NH, false, 2.5),
        [&] { inner_.flash_attention_backward(dqkv, delta, dout, out, qkv, lse, B, Tn, C, NH); });
}

void TimedKernels::gelu_forward(float* out, const float* inp, size_t n) const {
  timed(KernelOp::gelu_forward, mem(2.0 * n), [&] { inner_.gelu_forward(out, inp, n); });
}

void TimedKernels::gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const {
  timed(KernelOp::gelu_backward, mem(3.0 * n), [&] { inner_.gelu_backward(dinp, inp, dout, n); });
}

void TimedKernels::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w,
                                   int N, int C, double eps) const {
  timed(KernelOp::rmsnorm_forward, mem(2.0 * N * C),
        [&] { inner_.rmsnorm_forward(out, rstd, inp, w, N, C, eps); });
}

void TimedKernels::rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                    const float* w, const float* rstd, int N, int C) const {
  timed(KernelOp::rmsnorm_backward, mem(3.0 * N * C),
        [&] { inner_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); });
}

void TimedKernels::rope_forward(float* x, const float* cos, const float* sin, int B, int Tn,
                                int heads, int HS, size_t ld) const {
  timed(KernelOp::rope_forward, mem(2.0 * B * Tn * heads * HS),
        [&] { inner_.rope_forward(x, cos, sin, B, Tn, heads, HS, ld); });
}

void TimedKernels::rope_backward(float* dx, const float* cos, const float* sin, int B, int Tn,
                                 int heads, int HS, size_t ld) const {
  timed(KernelOp::rope_backward, mem(2.0 * B * Tn * heads * HS),
        [&] { inner_.rope_backward(dx, cos, sin, B, Tn, heads, HS, ld); });
}

void TimedKernels::swiglu_forward(float* out, const float* gate, const float* up, int N, int F,
                                  size_t ld) const {
  timed(KernelOp::swiglu_forward, mem(3.0 * N * F),
        [&] { inner_.swiglu_forward(out, gate, up, N, F, ld); });
}

void TimedKernels::swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                   const float* up, int N, int F, size_t ld) const {
  timed(KernelOp::swiglu_backward, mem(5.0 * N * F),
        [&] { inner_.swiglu_backward(dgate, dup, dout, gate, up, N, F, ld); });
}

void TimedKernels::gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v,
                                    int N, int NH, int NKV, int HS, ops::GqaMap m) const {
  timed(KernelOp::gqa_pack_forward, mem(2.0 * N * (NH + 2 * NKV) * HS),
        [&] { inner_.gqa_pack_forward(qkv, q, k, v, N, NH, NKV, HS, m); });
}

void TimedKernels::gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int N,
                                     int NH, int NKV, int HS, ops::GqaMap m) const {
  timed(KernelOp::gqa_pack_backward, mem(2.0 * N * (NH + 2 * NKV) * HS),
        [&] { inner_.gqa_pack_backward(dq, dk, dv, dqkv, N, NH, NKV, HS, m); });
}

void TimedKernels::residual_forward(float* out, const float* a, const float* b, size_t n) const {
  timed(KernelOp::residual_forward, mem(3.0 * n), [&] { inner_.residual_forward(out, a, b, n); });
}

void TimedKernels::residual_backward(float* da, float* db, const float* dout, size_t n) const {
  timed(KernelOp::residual_backward, mem(3.0 * n),
        [&] { inner_.residual_backward(da, db, dout, n); });
}

void TimedKernels::xent_local_max(float* rowmax, const float* logits, int N, int Vl, int v0,
                                  int V) const {
  timed(KernelOp::xent_local_max, mem(1.0 * N * Vl),
        [&] { inner_.xent_local_max(rowmax, logits, N, Vl, v0, V); });
}

void TimedKernels::xent_local_sums(float* sums, const float* logits, const float* rowmax,
                                   const int32_t* targets, int N, int Vl, int v0, int V) const {
  timed(KernelOp::xent_local_sums, mem(1.0 * N * Vl),
        [&] { inner_.xent_local_sums(sums, logits, rowmax, targets, N, Vl, v0, V); });
}

void TimedKernels::xent_losses(float* losses, const float* rowmax, const float* sums, int N) const {
  timed(KernelOp::xent_losses, mem(3.0 * N), [&] { inner_.xent_losses(losses, rowmax, sums, N); });
}

void TimedKernels::xent_local_backward(float* logits_dlogits, const float* rowmax,
                                       const float* sums, const float* dlosses,
                                       const int32_t* targets, int N, int Vl, int v0, int V) const {
  timed(KernelOp::xent_local_backward, mem(2.0 * N * Vl), [&] {
    inner_.xent_local_backward(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, v0, V);
  });
}

void TimedKernels::xent_rows(float* logits_dlogits, float* rowmax, float* sums,
                             const float* dlosses, const int32_t* targets, int N, int Vl,
                             int V) const {
  timed(KernelOp::xent_rows, mem(2.0 * N * Vl),
        [&] { inner_.xent_rows(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, V); });
}

void TimedKernels::hold_rounded(const float* x, size_t n) const {
  // fp32 rounds nothing: no work.
  const OpWork w = inner_.precision() == Precision::fp32 ? OpWork{} : mem(2.0 * n);
  timed(KernelOp::hold_rounded, w, [&] { inner_.hold_rounded(x, n); });
}

void TimedKernels::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                        const float* B, int ldb, float beta, float* C, int ldc) const {
  const GemmShape shape{KernelOp::gemm, M, N, K};
  const double m = M, n = N, k = K;
  timed(KernelOp::gemm, {2 * m * n * k, kF * (m * k + k * n + 2 * m * n)},
        [&] { inner_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); }, &shape);
}

void TimedKernels::zero(float* x, size_t n) const {
  timed(KernelOp::zero, mem(1.0 * n), [&] { inner_.zero(x, n); });
}

void TimedKernels::add(float* y, const float* x, size_t n) const {
  timed(KernelOp::add, mem(3.0 * n), [&] { inner_.add(y, x, n); });
}

void TimedKernels::add_bias(float* out, const float* bias, int N, int C) const {
  timed(KernelOp::add_bias, mem(2.0 * N * C), [&] { inner_.add_bias(out, bias, N, C); });
}

void TimedKernels::fill(float* x, float value, size_t n) const {
  timed(KernelOp::fill, mem(1.0 * n), [&] { inner_.fill(x, value, n); });
}

void TimedKernels::upload(void* dst, const void* host_src, size_t bytes) const {
  timed(KernelOp::upload, OpWork{0, static_cast<double>(bytes)},
        [&] { inner_.upload(dst, host_src, bytes); });
}

void TimedKernels::download(void* host_dst, const void* src, size_t bytes) const {
  timed(KernelOp::download, OpWork{0, static_cast<double>(bytes)},
        [&] { inner_.download(host_dst, src, bytes); });
}

void TimedKernels::adamw_update(float* params, const float* grads, float* m, float* v,
                                std::span<const AdamWSegment> segments, const AdamWHyper& h) const {
  double n = 0;
  for (const AdamWSegment& seg : segments) n += static_cast<double>(seg.count);
  // Reads p, g, m, v; writes p, m, v.
  timed(KernelOp::adamw_update, mem(7 * n),
        [&] { inner_.adamw_update(params, grads, m, v, segments, h); });
}

void TimedKernels::sums_of_squares(std::span<const Span> spans, double* out) const {
  double n = 0;
  for (const Span& sp : spans) n += static_cast<double>(sp.second);
  timed(KernelOp::sum_of_squares, {2 * n, kF * n}, [&] { inner_.sums_of_squares(spans, out); });
}

double TimedKernels::sum_of_squares(const float* x, size_t n) const {
  double r = 0;
  timed(KernelOp::sum_of_squares, {2.0 * n, kF * n}, [&] { r = inner_.sum_of_squares(x, n); });
  return r;
}

void TimedKernels::scale(float* x, float factor, size_t n) const {
  timed(KernelOp::scale, mem(2.0 * n), [&] { inner_.scale(x, factor, n); });
}

}  // namespace meshlm::ops
