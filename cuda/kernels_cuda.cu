// cuda::make_kernels: cuda/ops_cuda.h behind the ops::Kernels interface.
#include "cuda/kernels_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "ops/gpu_workspace.h"

#include "cuda/blas.cuh"
#include "cuda/cuda_check.cuh"

namespace meshlm::cuda {

namespace {

class CudaKernels final : public ops::Kernels {
public:
  CudaKernels(cudaStream_t stream, ops::Precision p) : s_(stream), p_(p) {
    for (int i = 0; i < 2; ++i) {
      CUDA_CHECK(cudaMallocHost(&stage_[i], ops::kUploadStageBytes));
      CUDA_CHECK(cudaEventCreateWithFlags(&staged_[i], cudaEventDisableTiming));
    }
    MemTracker::get().on_alloc(MemCategory::workspace, Device::cpu, 2 * ops::kUploadStageBytes);
  }
  ~CudaKernels() override {
    cudaStreamSynchronize(s_);
    for (int i = 0; i < 2; ++i) {
      cudaFreeHost(stage_[i]);
      cudaEventDestroy(staged_[i]);
    }
    MemTracker::get().on_free(MemCategory::workspace, Device::cpu, 2 * ops::kUploadStageBytes);
  }
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;
  Device device() const override { return Device::cuda; }
  ops::Precision precision() const override { return p_; }

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
  void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* w, const float* bias, int N,
                                  int C) const override {
    cuda::residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C, s_);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, s_);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N,
                      int IC, int OC) const override {
    cuda::matmul_forward(out, inp, w, bias, N, IC, OC, s_, p_,
                         {held(inp, size_t(N) * IC), held(w, size_t(OC) * IC), nullptr});
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int IC, int OC) const override {
    cuda::matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC, s_, p_,
                          {held(inp, size_t(N) * IC), held(w, size_t(OC) * IC),
                           held(dout, size_t(N) * OC)});
  }
  // Holds nest: each has a buffer of its own by depth, grown to the largest
  // span held at that depth and kept (ops/gpu_workspace.h).
  void hold_rounded(const float* x, size_t n) const override {
    const size_t depth = holds_.size();
    holds_.push_back({nullptr, 0});
    if (p_ == ops::Precision::fp32 || x == nullptr || n == 0) return;
    if (copies_.size() <= depth) copies_.resize(depth + 1);
    Buffer& copy = copies_[depth];
    if (copy.bytes() < 2 * n) {
      CUDA_CHECK(cudaStreamSynchronize(s_));  // earlier GEMMs may still read the old copy
      copy = Buffer();  // freed first: the peak is the larger of the two, as predicted
      copy = Buffer(2 * n, MemCategory::workspace, "gemm.held_16bit", Device::cuda);
    }
    cuda::round_span(p_, copy.data(), x, n, s_);
    holds_.back() = {x, n};
  }
  void release_rounded() const override {
    MESHLM_CHECK(!holds_.empty(), "release_rounded() without a hold");
    holds_.pop_back();
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int Tn, int C,
                         int NH) const override {
    cuda::attention_forward(out, att, qkv, B, Tn, C, NH, s_, p_);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, int B, int Tn, int C, int NH) const override {
    cuda::attention_backward(dqkv, datt, dout, qkv, att, B, Tn, C, NH, s_, p_);
  }
  bool supports_flash_attention(int head_size) const override {
    return ops::flash_attention_on_gpu(p_, head_size);
  }
  void flash_attention_forward(float* out, float* lse, const float* qkv, int B, int Tn, int C,
                               int NH) const override {
    cuda::flash_attention_forward(out, lse, qkv, B, Tn, C, NH, s_, p_);
  }
  void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* out,
                                const float* qkv, const float* lse, int B, int Tn, int C,
                                int NH) const override {
    cuda::flash_attention_backward(dqkv, delta, dout, out, qkv, lse, B, Tn, C, NH, s_, p_);
  }
  void gelu_forward(float* out, const float* inp, size_t n) const override {
    cuda::gelu_forward(out, inp, n, s_);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const override {
    cuda::gelu_backward(dinp, inp, dout, n, s_);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       double eps) const override {
    cuda::rmsnorm_forward(out, rstd, inp, w, N, C, eps, s_);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int N, int C) const override {
    cuda::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, s_);
  }
  void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a,
                                const float* b, const float* w, int N, int C,
                                double eps) const override {
    cuda::residual_rmsnorm_forward(res, out, rstd, a, b, w, N, C, eps, s_);
  }
  void rope_forward(float* x, const float* cos, const float* sin, int B, int Tn, int heads, int HS,
                    size_t ld) const override {
    cuda::rope_forward(x, cos, sin, B, Tn, heads, HS, ld, s_);
  }
  void rope_backward(float* dx, const float* cos, const float* sin, int B, int Tn, int heads,
                     int HS, size_t ld) const override {
    cuda::rope_backward(dx, cos, sin, B, Tn, heads, HS, ld, s_);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, int N, int F,
                      size_t ld) const override {
    cuda::swiglu_forward(out, gate, up, N, F, ld, s_);
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, int N, int F, size_t ld) const override {
    cuda::swiglu_backward(dgate, dup, dout, gate, up, N, F, ld, s_);
  }
  void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int N, int NH,
                        int NKV, int HS, ops::GqaMap m) const override {
    cuda::gqa_pack_forward(qkv, q, k, v, N, NH, NKV, HS, m, s_);
  }
  void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int N, int NH,
                         int NKV, int HS, ops::GqaMap m) const override {
    cuda::gqa_pack_backward(dq, dk, dv, dqkv, N, NH, NKV, HS, m, s_);
  }
  size_t cached_attention_scratch(int n, int keys, int NH) const override {
    return cuda::cached_attention_scratch(n, keys, NH);
  }
  void cached_attention_forward(float* out, float* kc, float* vc, const float* q, size_t ldq,
                                const float* k, const float* v, size_t ldkv, int n, int p0, int NH,
                                int NKV, int HS, float* scratch,
                                size_t scratch_floats) const override {
    cuda::cached_attention_forward(out, kc, vc, q, ldq, k, v, ldkv, n, p0, NH, NKV, HS, scratch,
                                   scratch_floats, s_);
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
  void xent_rows(float* logits_dlogits, float* rowmax, float* sums, const float* dlosses,
                 const int32_t* targets, int N, int Vl, int V) const override {
    cuda::xent_rows(logits_dlogits, rowmax, sums, dlosses, targets, N, Vl, V, s_);
  }

  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) const override {
    const auto [a, b] = ops::gemm_input_spans(ta, tb, M, N, K, lda, ldb);
    gemm_rm(s_, p_, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, held(A, a), held(B, b));
  }
  void zero(float* x, size_t n) const override {
    if (n > 0) CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), s_));
  }
  void add(float* y, const float* x, size_t n) const override { cuda::add(y, x, n, s_); }
  void add_bias(float* out, const float* bias, int N, int C) const override {
    cuda::add_bias(out, bias, N, C, s_);
  }
  void fill(float* x, float value, size_t n) const override { cuda::fill(x, value, n, s_); }
  void copy(float* dst, const float* src, size_t n) const override {
    if (n > 0)
      CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, s_));
  }
  // Copies from pageable memory (the model's host tensors, the node-shared
  // window of the quantized base, a micro-batch's token ids) go through two
  // pinned buffers in turn: the host fills one while the device reads the
  // other. Nothing waits for the last copy: the ops queued after it find its
  // bytes, and the host waits for a buffer only to fill it again.
  void upload(void* dst, const void* host_src, size_t bytes) const override {
    const auto* src = static_cast<const unsigned char*>(host_src);
    auto* out = static_cast<unsigned char*>(dst);
    for (size_t off = 0, i = 0; off < bytes; off += ops::kUploadStageBytes, i ^= 1) {
      const size_t n = std::min(ops::kUploadStageBytes, bytes - off);
      CUDA_CHECK(cudaEventSynchronize(staged_[i]));  // the last copy out of this buffer is done
      std::memcpy(stage_[i], src + off, n);
      CUDA_CHECK(cudaMemcpyAsync(out + off, stage_[i], n, cudaMemcpyHostToDevice, s_));
      CUDA_CHECK(cudaEventRecord(staged_[i], s_));
    }
  }
  void download(void* host_dst, const void* src, size_t bytes) const override {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, s_));
    CUDA_CHECK(cudaStreamSynchronize(s_));
  }
  void synchronize() const override { CUDA_CHECK(cudaStreamSynchronize(s_)); }
  bool holds(const void* p) const override {
    cudaPointerAttributes a{};
    CUDA_CHECK(cudaPointerGetAttributes(&a, p));
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  void adamw_update(float* params, const float* grads, float* m, float* v,
                    std::span<const ops::AdamWSegment> segments,
                    const ops::AdamWHyper& h) const override {
    if (segments.empty()) return;
    // The segments stay on the device while they are the same (every step).
    if (!std::equal(segments.begin(), segments.end(), segments_.begin(), segments_.end(),
                    [](const ops::AdamWSegment& a, const ops::AdamWSegment& b) {
                      return a.begin == b.begin && a.count == b.count && a.decay == b.decay;
                    })) {
      segments_.assign(segments.begin(), segments.end());
      d_segments_ = Buffer();  // freed first: the peak is the larger of the two
      d_segments_ = Buffer(segments.size() * sizeof(ops::AdamWSegment), MemCategory::optimizer,
                           "adamw.segments", Device::cuda);
      upload(d_segments_.data(), segments_.data(), d_segments_.bytes());
      max_count_ = 0;
      for (const auto& s : segments_) max_count_ = std::max(max_count_, s.count);
    }
    cuda::adamw_step(params, grads, m, v, d_segments_.as<ops::AdamWSegment>(),
                     static_cast<int>(segments_.size()), max_count_, h, s_);
  }
  void mean(float* out, const float* x, size_t n) const override { cuda::mean(out, x, n, s_); }
  double sum_of_squares(const float* x, size_t n) const override {
    double out = 0;
    const Span span{x, n};
    sums_of_squares({&span, 1}, &out);
    return out;
  }
  // Every span's sum as cuda::sum_of_squares gives it, into one scratch: the
  // k sums first, then each span's partials; one download.
  void sums_of_squares(std::span<const Span> spans, double* out) const override {
    const size_t k = spans.size();
    if (k == 0) return;
    size_t need = k;
    for (const Span& s : spans) need += cuda::sum_of_squares_scratch(s.second);
    if (scratch_.bytes() < need * sizeof(double)) {  // the last use was waited for
      scratch_ = Buffer();  // freed first: the peak is the larger of the two, as predicted
      scratch_ = Buffer(need * sizeof(double), MemCategory::workspace, "sum_of_squares.scratch",
                        Device::cuda);
    }
    double* d = scratch_.as<double>();
    double* partials = d + k;
    for (size_t i = 0; i < k; ++i) {
      cuda::sum_of_squares(d + i, partials, spans[i].first, spans[i].second, s_);
      partials += cuda::sum_of_squares_scratch(spans[i].second);
    }
    download(out, d, k * sizeof(double));
  }
  void scale(float* x, float factor, size_t n) const override { cuda::scale(x, n, factor, s_); }

private:
  // The held copy of x[0, n), where x[0, n) lies within a held span; else null.
  const void* held(const float* x, size_t n) const {
    if (x == nullptr) return nullptr;
    for (size_t i = 0; i < holds_.size(); ++i) {
      const auto [w, wn] = holds_[i];
      if (w != nullptr && x >= w && x + n <= w + wn)
        return copies_[i].as<char>() + 2 * size_t(x - w);
    }
    return nullptr;
  }

  cudaStream_t s_;
  ops::Precision p_;
  // hold_rounded's spans, innermost last, and the copies by depth (2 bytes an element).
  mutable std::vector<std::pair<const float*, size_t>> holds_;
  mutable std::vector<Buffer> copies_;
  void* stage_[2] = {nullptr, nullptr};  // pinned host memory of upload()
  cudaEvent_t staged_[2] = {nullptr, nullptr};
  // adamw_update's segments (host copy, device copy) and the sum's scratch.
  mutable std::vector<ops::AdamWSegment> segments_;
  mutable Buffer d_segments_;
  mutable size_t max_count_ = 0;
  mutable Buffer scratch_;
};

class CudaDequantizer final : public quant::Dequantizer {
public:
  explicit CudaDequantizer(cudaStream_t stream) : s_(stream) {}
  Device device() const override { return Device::cuda; }
  void rows(const quant::QSlice& w, int64_t i0, int64_t n, float* out) const override {
    cuda::dequantize_rows(w, i0, n, out, s_);
  }
  void lookup(float* out, const int32_t* ids, int N, const quant::QSlice& w,
              int64_t first) const override {
    cuda::dequantize_lookup(out, ids, N, w, first, s_);
  }

private:
  cudaStream_t s_;
};

}  // namespace

std::unique_ptr<quant::Dequantizer> make_dequantizer(cudaStream_t stream) {
  return std::make_unique<CudaDequantizer>(stream);
}

std::unique_ptr<ops::Kernels> make_kernels(cudaStream_t stream, ops::Precision p) {
  return std::make_unique<CudaKernels>(stream, p);
}

}  // namespace meshlm::cuda
