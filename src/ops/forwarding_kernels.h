// A Kernels that passes every op to another one through around(), the one
// place a wrapper adds what it does to each op: runtime.op_timings' clock
// (ops/timed_kernels.h), the emulated device's opening of its memory
// (train/emulated_device.h). Every call reaches the inner backend as it is,
// so the results are the inner backend's bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>

#include "ops/kernels.h"

namespace meshlm::ops {

// The ops of Kernels, in the order of the op timing table; a fixed enum so that ranks can
// reduce their tables without exchanging names.
enum class KernelOp : int {
  embedding_forward, embedding_backward, position_forward, position_backward,
  layernorm_forward, layernorm_backward, residual_layernorm_forward, matmul_forward,
  matmul_backward,
  attention_forward, attention_backward, flash_attention_forward, flash_attention_backward,
  gelu_forward, gelu_backward, rmsnorm_forward, rmsnorm_backward, residual_rmsnorm_forward,
  rope_forward, rope_backward,
  swiglu_forward, swiglu_backward, gqa_pack_forward, gqa_pack_backward, cached_attention_forward,
  residual_forward,
  residual_backward,
  xent_local_max, xent_local_sums, xent_losses, xent_local_backward, xent_rows,
  gemm, hold_rounded, zero, add, add_bias, fill, copy, upload, download, adamw_update,
  sum_of_squares, scale, mean, count
};
const char* kernel_op_name(KernelOp op);

// The work an op did: floating-point operations (a multiply-add is 2) and
// the bytes it must at least read and write once (its operands and results,
// each once), for the rates of the step's time budget (meshlm_bench
// --budget 1). A model of the op's arguments, not a hardware count.
struct OpWork {
  double flops = 0, bytes = 0;
};

// One GEMM shape of the step: C (M x N) = A (M x K) B (K x N) and its
// transposes. matmul_forward (N rows, IC -> OC) books (N, OC, IC);
// matmul_backward its two products (N, IC, OC) for dinp and (OC, IC, N) for
// dw, under one entry (op, N, OC, IC).
struct GemmShape {
  KernelOp op;
  int m, n, k;
  bool operator<(const GemmShape& o) const {
    return std::tie(op, m, n, k) < std::tie(o.op, o.m, o.n, o.k);
  }
};
// A callable borrowed for the duration of one call (the op's body).
class OpBody {
public:
  template <typename F>
  OpBody(const F& f) : obj_(&f), call_([](const void* o) { (*static_cast<const F*>(o))(); }) {}
  void operator()() const { call_(obj_); }

private:
  const void* obj_;
  void (*call_)(const void*);
};

class ForwardingKernels : public Kernels {
public:
  // `inner` must outlive this.
  explicit ForwardingKernels(const Kernels& inner) : inner_(inner) {}
  const Kernels& inner() const { return inner_; }

  Device device() const override { return inner_.device(); }
  Precision precision() const override { return inner_.precision(); }
  bool supports_flash_attention(int head_size) const override {
    return inner_.supports_flash_attention(head_size);
  }
  void synchronize() const override { inner_.synchronize(); }
  bool holds(const void* p) const override { return inner_.holds(p); }
  void release_rounded() const override { inner_.release_rounded(); }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte_part, int N, int C,
                         int v0, int Vl) const override;
  void embedding_backward(float* dwte_part, const float* dout, const int32_t* tokens, int N, int C,
                          int v0, int Vl) const override;
  void position_forward(float* out, const float* wpe, int B, int Tn, int C) const override;
  void position_backward(float* dwpe, const float* dout, int B, int Tn, int C) const override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) const override;
  void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* w, const float* bias, int N,
                                  int C) const override;
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override;
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N,
                      int IC, int OC) const override;
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int IC, int OC) const override;
  void attention_forward(float* out, float* att, const float* qkv, int B, int Tn, int C,
                         int NH) const override;
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, int B, int Tn, int C, int NH) const override;
  void flash_attention_forward(float* out, float* lse, const float* qkv, int B, int Tn, int C,
                               int NH) const override;
  void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* out,
                                const float* qkv, const float* lse, int B, int Tn, int C,
                                int NH) const override;
  void gelu_forward(float* out, const float* inp, size_t n) const override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const override;
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       double eps) const override;
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int N, int C) const override;
  void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                const float* b, const float* w, int N, int C,
                                double eps) const override;
  void rope_forward(float* x, const float* cos, const float* sin, int B, int Tn, int heads, int HS,
                    size_t ld) const override;
  void rope_backward(float* dx, const float* cos, const float* sin, int B, int Tn, int heads,
                     int HS, size_t ld) const override;
  void swiglu_forward(float* out, const float* gate, const float* up, int N, int F,
                      size_t ld) const override;
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, int N, int F, size_t ld) const override;
  void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int N, int NH,
                        int NKV, int HS, ops::GqaMap m) const override;
  void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int N, int NH,
                         int NKV, int HS, ops::GqaMap m) const override;
  size_t cached_attention_scratch(int n, int keys, int NH) const override {
    return inner_.cached_attention_scratch(n, keys, NH);
  }
  void cached_attention_forward(float* out, float* kc, float* vc, const float* q, size_t ldq,
                                const float* k, const float* v, size_t ldkv, int n, int p0, int NH,
                                int NKV, int HS, float* scratch,
                                size_t scratch_floats) const override;
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override;
  void residual_backward(float* da, float* db, const float* dout, size_t n) const override;
  void xent_local_max(float* rowmax, const float* logits, int N, int Vl, int v0,
                      int V) const override;
  void xent_local_sums(float* sums, const float* logits, const float* rowmax,
                       const int32_t* targets, int N, int Vl, int v0, int V) const override;
  void xent_losses(float* losses, const float* rowmax, const float* sums, int N) const override;
  void xent_local_backward(float* logits_dlogits, const float* rowmax, const float* sums,
                           const float* dlosses, const int32_t* targets, int N, int Vl, int v0,
                           int V) const override;
  void xent_rows(float* logits_dlogits, float* rowmax, float* sums, const float* dlosses,
                 const int32_t* targets, int N, int Vl, int V) const override;
  void hold_rounded(const float* x, size_t n) const override;
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) const override;
  void zero(float* x, size_t n) const override;
  void add(float* y, const float* x, size_t n) const override;
  void add_bias(float* out, const float* bias, int N, int C) const override;
  void fill(float* x, float value, size_t n) const override;
  void copy(float* dst, const float* src, size_t n) const override;
  void upload(void* dst, const void* host_src, size_t bytes) const override;
  void download(void* host_dst, const void* src, size_t bytes) const override;
  void adamw_update(float* params, const float* grads, float* m, float* v,
                    std::span<const AdamWSegment> segments, const AdamWHyper& h) const override;
  double sum_of_squares(const float* x, size_t n) const override;
  void sums_of_squares(std::span<const Span> spans, double* out) const override;
  void scale(float* x, float factor, size_t n) const override;
  void mean(float* out, const float* x, size_t n) const override;

protected:
  // Runs `body` (the inner backend's op) for `op`, whose work is `w` (and,
  // for a GEMM, whose shape is `shape`; null otherwise).
  virtual void around(KernelOp op, const OpWork& w, const GemmShape* shape,
                      const OpBody& body) const = 0;

  const Kernels& inner_;
};

}  // namespace meshlm::ops
