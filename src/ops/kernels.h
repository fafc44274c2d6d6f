// The ops of a training step behind one interface, so that the model runs
// the same code on either backend: Kernels::cpu() calls the CPU ops of
// ops/ops.h on host memory; cuda/kernels_cuda.h gives the CUDA ops of
// cuda/ops_cuda.h on device memory, queued on one stream. Every method has
// the semantics of its namesake in ops/ops.h (forward ops overwrite; backward
// ops accumulate into parameter gradients and the residual stream's, and
// overwrite the input gradients of matmul, attention and GELU), in float, with the pointers in the backend's memory. A
// backend computes at one precision (ops/precision.h): the GEMMs of
// matmul_*, attention_* and gemm round their inputs to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "core/tensor.h"
#include "ops/ops.h"

namespace meshlm::ops {

class Kernels {
public:
  virtual ~Kernels() = default;
  // The CPU backend at precision `p` (one per precision and process; OpenMP
  // and BLAS threads as set). Below fp32 it emulates the rounding.
  static const Kernels& cpu(Precision p = Precision::fp32);
  // Where the pointers given to this backend live.
  virtual Device device() const = 0;
  virtual Precision precision() const = 0;

  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte_part, int N,
                                 int C, int v0, int Vl) const = 0;
  virtual void embedding_backward(float* dwte_part, const float* dout, const int32_t* tokens,
                                  int N, int C, int v0, int Vl) const = 0;
  virtual void position_forward(float* out, const float* wpe, int B, int Tn, int C) const = 0;
  virtual void position_backward(float* dwpe, const float* dout, int B, int Tn, int C) const = 0;
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int N, int C) const = 0;
  virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                  const float* inp, const float* w, const float* mean,
                                  const float* rstd, int N, int C) const = 0;
  virtual void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd,
                                          const float* a, const float* b, const float* w,
                                          const float* bias, int N, int C) const = 0;
  virtual void matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                              int N, int IC, int OC) const = 0;
  virtual void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                               const float* inp, const float* w, int N, int IC,
                               int OC) const = 0;
  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int Tn, int C,
                                 int NH) const = 0;
  virtual void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                                  const float* att, int B, int Tn, int C, int NH) const = 0;
  // ops::flash_attention_*: lse(B,NH,T) instead of the probabilities. Only
  // where supports_flash_attention(C / NH) says so.
  virtual bool supports_flash_attention(int head_size) const = 0;
  virtual void flash_attention_forward(float* out, float* lse, const float* qkv, int B, int Tn,
                                       int C, int NH) const = 0;
  virtual void flash_attention_backward(float* dqkv, float* delta, const float* dout,
                                        const float* out, const float* qkv, const float* lse,
                                        int B, int Tn, int C, int NH) const = 0;
  virtual void gelu_forward(float* out, const float* inp, size_t n) const = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const = 0;
  // Llama's ops (ops::rmsnorm_*, rope_*, swiglu_*, gqa_pack_*); the rope
  // tables in the backend's memory.
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                               int C, double eps) const = 0;
  virtual void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                const float* w, const float* rstd, int N, int C) const = 0;
  virtual void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                        const float* b, const float* w, int N, int C,
                                        double eps) const = 0;
  virtual void rope_forward(float* x, const float* cos, const float* sin, int B, int Tn, int heads,
                            int HS, size_t ld) const = 0;
  virtual void rope_backward(float* dx, const float* cos, const float* sin, int B, int Tn,
                             int heads, int HS, size_t ld) const = 0;
  virtual void swiglu_forward(float* out, const float* gate, const float* up, int N, int F,
                              size_t ld) const = 0;
  virtual void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                               const float* up, int N, int F, size_t ld) const = 0;
  virtual void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int N,
                                int NH, int NKV, int HS, ops::GqaMap m) const = 0;
  virtual void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int N, int NH,
                                 int NKV, int HS, ops::GqaMap m) const = 0;
  // meshlm generate's attention against a key/value cache
  // (ops::cached_attention_forward, the caches in the backend's memory):
  // `scratch` holds scratch_floats, at least cached_attention_scratch(n,
  // keys, NH) for n rows seeing up to `keys` positions.
  virtual size_t cached_attention_scratch(int n, int keys, int NH) const = 0;
  virtual void cached_attention_forward(float* out, float* kc, float* vc, const float* q,
                                        size_t ldq, const float* k, const float* v, size_t ldkv,
                                        int n, int p0, int NH, int NKV, int HS, float* scratch,
                                        size_t scratch_floats) const = 0;
  virtual void residual_forward(float* out, const float* a, const float* b, size_t n) const = 0;
  virtual void residual_backward(float* da, float* db, const float* dout, size_t n) const = 0;
  virtual void xent_local_max(float* rowmax, const float* logits, int N, int Vl, int v0,
                              int V) const = 0;
  virtual void xent_local_sums(float* sums, const float* logits, const float* rowmax,
                               const int32_t* targets, int N, int Vl, int v0, int V) const = 0;
  virtual void xent_losses(float* losses, const float* rowmax, const float* sums, int N) const = 0;
  virtual void xent_local_backward(float* logits_dlogits, const float* rowmax, const float* sums,
                                   const float* dlosses, const int32_t* targets, int N, int Vl,
                                   int v0, int V) const = 0;
  // Rows holding the whole vocabulary (one tensor-parallel rank: v0 = 0,
  // V <= Vl): xent_local_max and xent_local_sums, and with dlosses
  // xent_local_backward in place, where the backend can in one read of each
  // row for the max and the sum together (CUDA: online, so the sum's last
  // bits may differ from xent_local_sums'). The CPU runs ops::xent_rows: the
  // three ops' bits, each row read from memory once.
  virtual void xent_rows(float* logits_dlogits, float* rowmax, float* sums, const float* dlosses,
                         const int32_t* targets, int N, int Vl, int V) const {
    xent_local_max(rowmax, logits_dlogits, N, Vl, 0, V);
    xent_local_sums(sums, logits_dlogits, rowmax, targets, N, Vl, 0, V);
    if (dlosses != nullptr)
      xent_local_backward(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, 0, V);
  }

  // Row-major C(M,N) = alpha op(A) op(B) + beta C (ops::gemm), A and B
  // rounded to precision().
  virtual void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc) const = 0;
  // ---- one rounding of an operand for many GEMMs -------------------------
  // Until the matching release_rounded(), every GEMM of this backend
  // (matmul_forward's and matmul_backward's, gemm's) whose input lies within
  // x[0, n) reads one copy of it rounded to precision() now, instead of
  // rounding it again: the same bits, as long as x does not change
  // meanwhile. Holds nest (released innermost first). The classifier's
  // chunks hold wte so; a LoRA layer's backward holds its input and dout
  // for the base's input gradient and the adapter's four products. The CUDA
  // backend keeps a device buffer per depth of nesting, grown to the largest
  // span held there (ops/gpu_workspace.h); the CPU's GEMMs round as they
  // read, so there it does nothing, as at fp32.
  virtual void hold_rounded(const float* x, size_t n) const { (void)x, (void)n; }
  virtual void release_rounded() const {}
  // x(n) = 0
  virtual void zero(float* x, size_t n) const = 0;
  // y(n) += x(n)
  virtual void add(float* y, const float* x, size_t n) const = 0;
  // out(N,C) += bias(C), every row
  virtual void add_bias(float* out, const float* bias, int N, int C) const = 0;
  // x(n) = value
  virtual void fill(float* x, float value, size_t n) const = 0;
  // dst(n) = src(n), both in the backend's memory, not overlapping
  virtual void copy(float* dst, const float* src, size_t n) const = 0;

  // ---- between the host and the backend's memory ------------------------------
  // upload returns once host_src may be reused; the copy is queued ahead of
  // every op issued after it (on a GPU it may still be in flight: the bytes
  // sit in pinned memory of the backend's). download returns when the bytes
  // are on the host: it waits for every op queued before it.
  virtual void upload(void* dst, const void* host_src, size_t bytes) const = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) const = 0;
  // Waits for every op queued so far (a no-op on the CPU).
  virtual void synchronize() const = 0;
  // True when `p` points into the backend's device memory (never on the
  // CPU): what host staging copies through upload and download
  // (comm/staged_comm.h).
  virtual bool holds(const void* p) const {
    (void)p;
    return false;
  }

  // ---- the optimizer (ops/ops.h) ---------------------------------------------
  virtual void adamw_update(float* params, const float* grads, float* m, float* v,
                            std::span<const AdamWSegment> segments,
                            const AdamWHyper& h) const = 0;
  // Returns when the sum is known.
  virtual double sum_of_squares(const float* x, size_t n) const = 0;
  // out[i] = sum_of_squares(spans[i]) for every span, the same bits, waiting
  // for the backend once for all of them (one span per parameter tensor in
  // the gradient norm).
  using Span = std::pair<const float*, size_t>;
  virtual void sums_of_squares(std::span<const Span> spans, double* out) const {
    for (size_t i = 0; i < spans.size(); ++i) out[i] = sum_of_squares(spans[i].first, spans[i].second);
  }
  virtual void scale(float* x, float factor, size_t n) const = 0;
  // out[0] = the mean of x(n), n >= 1 (ops::mean: summed in double; the
  // CUDA backend in another order), out in the backend's memory: a
  // micro-batch's loss kept there until the step reads them all at once.
  virtual void mean(float* out, const float* x, size_t n) const = 0;
};

// hold_rounded for the life of a scope; nothing held where x is null.
class HeldRounded {
public:
  HeldRounded(const Kernels& k, const float* x, size_t n) : k_(x ? &k : nullptr) {
    if (k_) k_->hold_rounded(x, n);
  }
  ~HeldRounded() {
    if (k_) k_->release_rounded();
  }
  HeldRounded(const HeldRounded&) = delete;
  HeldRounded& operator=(const HeldRounded&) = delete;

private:
  const Kernels* k_;
};

}  // namespace meshlm::ops
