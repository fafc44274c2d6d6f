// The CUDA backend's 16-bit copies of GEMM inputs (ops/gpu_workspace.h), as
// the model declares its step (model/step_declaration.h) and the memory
// prediction counts it (plan/memory.h, device_gemm_copies_bytes), against
// the GEMMs the model really issues: a backend that runs the CPU ops and
// records, for each call, the spans the CUDA backend would copy (as
// cuda/blas.cu and cuda/attention.cu call cuBLAS, and as
// cuda/flash_attention.cu rounds its inputs), and the copies it holds for
// several GEMMs (Kernels::hold_rounded). Every layout the CUDA
// backend trains (one rank: full training or LoRA, probabilities or flash,
// the classifier in chunks; GPT-2 and a Llama) gives the prediction exactly. The scratch of the
// reductions over rows (device_reduction_scratch_bytes) likewise.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/rng.h"
#include "load/base_loader.h"
#include "model/gpt.h"
#include "model/step_declaration.h"
#include "ops/gpu_workspace.h"
#include "ops/timed_kernels.h"
#include "plan/memory.h"
#include "plan/rank_plan.h"
#include "train/trainer.h"

using namespace meshlm;

namespace {

class SpanRecorder final : public ops::TimedKernels {
public:
  explicit SpanRecorder(const ops::Kernels& inner) : TimedKernels(inner) {}
  size_t most() const { return most_ + held(); }
  // The held copies' buffers alone.
  size_t held() const {
    size_t bytes = 0;
    for (size_t b : depth_bytes_) bytes += b;
    return bytes;
  }

  // Spans held rounded (cuda/kernels_cuda.cu): a copy of each beside the
  // buffer, one buffer per depth of nesting, and GEMMs round only the
  // inputs no hold covers.
  void hold_rounded(const float* x, size_t n) const override {
    const size_t depth = holds_.size();
    holds_.push_back({x, n});
    if (depth_bytes_.size() <= depth) depth_bytes_.resize(depth + 1, 0);
    depth_bytes_[depth] = std::max(depth_bytes_[depth], 2 * n);
    TimedKernels::hold_rounded(x, n);
  }
  void release_rounded() const override {
    holds_.pop_back();
    TimedKernels::release_rounded();
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N,
                      int IC, int OC) const override {
    copies(unheld(inp, size_t(N) * IC), unheld(w, size_t(OC) * IC));
    TimedKernels::matmul_forward(out, inp, w, bias, N, IC, OC);
  }
  // dout rounded once for both GEMMs (cuda/blas.cu), w for dinp, inp for dw.
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int IC, int OC) const override {
    copies(unheld(dout, size_t(N) * OC), dinp ? unheld(w, size_t(OC) * IC) : 0,
           dw ? unheld(inp, size_t(N) * IC) : 0);
    if (dbias) partials_ = std::max(partials_, ops::column_partials_bytes(N, size_t(OC)));
    TimedKernels::matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int Tn, int C,
                         int NH) const override {
    const int HS = C / NH;
    const long long TT = static_cast<long long>(Tn) * Tn;
    record(false, true, Tn, Tn, HS, 3 * C, 3 * C, HS, HS, NH);
    record(false, false, Tn, HS, Tn, Tn, 3 * C, TT, HS, NH);
    TimedKernels::attention_forward(out, att, qkv, B, Tn, C, NH);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, int B, int Tn, int C, int NH) const override {
    const int HS = C / NH;
    const long long TT = static_cast<long long>(Tn) * Tn;
    record(false, true, Tn, Tn, HS, C, 3 * C, HS, HS, NH);
    record(true, false, Tn, HS, Tn, Tn, C, TT, HS, NH);
    record(false, false, Tn, HS, Tn, Tn, 3 * C, TT, HS, NH);
    record(true, false, Tn, HS, Tn, Tn, 3 * C, TT, HS, NH);
    TimedKernels::attention_backward(dqkv, datt, dout, qkv, att, B, Tn, C, NH);
  }
  // The fused attention rounds qkv (and dout in the backward) into the same
  // buffer (cuda/flash_attention.cu).
  void flash_attention_forward(float* out, float* lse, const float* qkv, int B, int Tn, int C,
                               int NH) const override {
    most_ = std::max(most_, ops::gemm_16bit_copies_bytes(size_t(B) * Tn * 3 * C, 0));
    TimedKernels::flash_attention_forward(out, lse, qkv, B, Tn, C, NH);
  }
  void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* out,
                                const float* qkv, const float* lse, int B, int Tn, int C,
                                int NH) const override {
    most_ = std::max(most_, ops::gemm_16bit_copies_bytes(size_t(B) * Tn * 3 * C,
                                                         size_t(B) * Tn * C));
    TimedKernels::flash_attention_backward(dqkv, delta, dout, out, qkv, lse, B, Tn, C, NH);
  }
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) const override {
    const auto [a, b] = ops::gemm_input_spans(ta, tb, M, N, K, lda, ldb);
    copies(unheld(A, a), unheld(B, b));
    TimedKernels::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  // The reductions over rows (cuda/scratch.cuh): LayerNorm's dw and db, RMSNorm's dw, the
  // bias gradients (above) and the embedding's index.
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    if (dw) partials_ = std::max(partials_, ops::column_partials_bytes(N, 2 * size_t(C)));
    TimedKernels::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  // RMSNorm's dw alone (cuda/llama_ops.cu).
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                        const float* w, const float* rstd, int N, int C) const override {
    if (dw) partials_ = std::max(partials_, ops::column_partials_bytes(N, size_t(C)));
    TimedKernels::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void embedding_backward(float* dwte_part, const float* dout, const int32_t* tokens, int N, int C,
                          int v0, int Vl) const override {
    index_ = std::max(index_, ops::embedding_index_bytes(N));
    TimedKernels::embedding_backward(dwte_part, dout, tokens, N, C, v0, Vl);
  }
  size_t reduction_scratch() const { return partials_ + index_; }

private:
  void record(bool ta, bool tb, int M, int N, int K, int lda, int ldb, long long sa = 0,
              long long sb = 0, int batch = 1) const {
    const auto [a, b] = ops::gemm_input_spans(ta, tb, M, N, K, lda, ldb, sa, sb, batch);
    most_ = std::max(most_, ops::gemm_16bit_copies_bytes(a, b));
  }
  void copies(size_t a, size_t b, size_t c = 0) const {
    most_ = std::max(most_, ops::gemm_16bit_copies_bytes(a, b, c));
  }
  // n, or 0 where a hold covers x[0, n).
  size_t unheld(const float* x, size_t n) const {
    for (const auto& [h, hn] : holds_)
      if (x >= h && x + n <= h + hn) return 0;
    return n;
  }
  mutable size_t most_ = 0, partials_ = 0, index_ = 0;
  mutable std::vector<std::pair<const float*, size_t>> holds_;
  mutable std::vector<size_t> depth_bytes_;
};

struct Case {
  const char* name;
  bool lora;
  Attention attention;
  int classifier_rows;  // 0: automatic (all rows here)
  LinearSlots targets = LinearSlots::of(ModelArch::gpt2);
  int qtile_rows = 0;   // 0: the CPU's 64
  bool whole_classifier = false;
};

LinearSlots only(LinearSlot s) {
  LinearSlots t;
  t.add(s);
  return t;
}

}  // namespace

TEST(GpuWorkspace, PredictedCopiesAndScratchAreTheLargestTheModelAsksFor) {
  // Three shapes, each with another largest GEMM: the MLP (and under LoRA
  // its quantized tiles), attention's (T, T) products (many heads, long
  // sequences), the classifier (a large vocabulary).
  struct Shape {
    GPTConfig cfg;
    int B, T;
  };
  GPTConfig llama{.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 300, .max_seq_len = 40};
  llama.arch = ModelArch::llama;
  llama.n_kv_head = 2;
  llama.intermediate_size = 176;
  llama.tie_word_embeddings = false;
  const Shape shapes[] = {
      {{.n_layer = 2, .n_head = 4, .n_embd = 128, .vocab_size = 300, .max_seq_len = 40}, 3, 40},
      {{.n_layer = 1, .n_head = 8, .n_embd = 32, .vocab_size = 60, .max_seq_len = 64}, 3, 64},
      {{.n_layer = 1, .n_head = 2, .n_embd = 32, .vocab_size = 1000, .max_seq_len = 40}, 3, 40},
      // A Llama (no biases, RMSNorm's dw, grouped-query k and v, SwiGLU, an
      // untied lm_head) as the CUDA backend would run it.
      {llama, 3, 40},
  };
  const Case cases[] = {
      {"full, probabilities", false, Attention::probabilities, 0},
      {"full, flash", false, Attention::flash, 0},
      {"full, flash, classifier 7 rows at a time", false, Attention::flash, 7},
      {"lora all, probabilities", true, Attention::probabilities, 0},
      {"lora all, flash, classifier 50 rows", true, Attention::flash, 50},
      {"lora mlp-down only, flash", true, Attention::flash, 0, only(LinearSlot::mlp_down)},
      {"lora all, flash, tiles of 200 rows", true, Attention::flash, 0, LinearSlots::of(ModelArch::gpt2), 200},
      {"lora all, flash, a GPU's tiles", true, Attention::flash, 0, LinearSlots::of(ModelArch::gpt2), 8192, true},
  };
  for (const Shape& sh : shapes) {
    const GPTConfig& cfg = sh.cfg;
    const int B = sh.B, T = sh.T;
    const load::StoreManifest manifest = load::make_manifest(cfg, quant::QuantType::nf4);
    Buffer store(manifest.bytes, MemCategory::quantized, "test.store");
    quant::QuantConfig q;
    q.type = quant::QuantType::nf4;
    load::fill_store(cfg, q, 5, manifest, store.as<uint8_t>(), /*use_cache=*/false);
    std::vector<size_t> seen;
    for (const Case& k : cases) {
      SCOPED_TRACE(std::string(k.name) + ", C = " + std::to_string(cfg.n_embd) + ", NH = " +
                   std::to_string(cfg.n_head) + ", V = " + std::to_string(cfg.vocab_size));
      ParallelConfig par;
      par.dp = par.tp = par.pp = par.micro_batches = 1;
      FinetuneConfig ft;
      if (k.lora) {
        ft.mode = FinetuneMode::lora;
        ft.lora_rank = 3;
        // A Llama's layers for GPT-2's: all of them, or its MLP's down projection.
        ft.lora_targets = cfg.arch == ModelArch::gpt2 ? k.targets
                          : k.targets == only(LinearSlot::mlp_down) ? only(LinearSlot::down)
                                                                     : LinearSlots::of(cfg.arch);
      }
      RankPlan shape = plan_rank(cfg, par, ft, B, T, {}, k.attention);
      shape.model.classifier_rows = k.classifier_rows;
      shape.model.qtile_rows = k.qtile_rows;
      shape.model.whole_classifier_tile = k.whole_classifier;
      const SpanRecorder rec(ops::Kernels::cpu(ops::Precision::bf16));
      GPTOptions o = shape.model;
      o.kernels = &rec;
      GPT m(cfg, shape.shard, o);
      if (k.lora)
        m.attach_base([&](const ParamSpec& p) {
          const load::StoreEntry& e = manifest.at(p.name);
          return quant::qtensor_at(e.layout, store.as<uint8_t>() + e.offset);
        });
      m.init_weights(1);
      Rng rng(2);
      std::vector<int32_t> tok(size_t(B) * T), tgt(tok.size());
      for (auto& t : tok) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
      for (auto& t : tgt) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
      m.zero_grads();
      m.forward(tok.data(), tgt.data(), B, T);
      m.backward();
      ASSERT_GT(rec.most(), 0u);
      const StepDeclaration step = declare_step(cfg, shape.shard, shape.model, B, T);
      EXPECT_EQ(device_gemm_copies_bytes(step, ops::Precision::bf16), rec.most());
      EXPECT_EQ(device_gemm_copies_bytes(step, ops::Precision::fp32), 0u);
      EXPECT_EQ(device_reduction_scratch_bytes(step), rec.reduction_scratch());
      if (!k.lora) EXPECT_GT(rec.reduction_scratch(), 0u);
      // Held: wte for the classifier's chunks in full training; under LoRA
      // the adapted layers' inputs and douts (and a GPU's whole classifier tile).
      if (!k.lora)
        EXPECT_EQ(rec.held(), 2 * size_t(cfg.padded_vocab_size()) * cfg.n_embd);
      else
        EXPECT_GT(rec.held(), 0u);
      seen.push_back(rec.most() - rec.held());
    }
    // The GEMMs' own copies differ where this shape's largest GEMM differs:
    // the test sees each part of the prediction at work somewhere.
    if (cfg.n_head == 8) EXPECT_GT(seen[0], seen[1]) << "attention's products are the largest";
    if (cfg.vocab_size == 1000) EXPECT_GT(seen[1], seen[2]) << "the classifier is the largest";
    if (cfg.n_embd == 128) {
      EXPECT_GT(seen[1], seen[4]) << "LoRA's tiles are smaller";
      EXPECT_GT(seen[6], seen[4]) << "tiles of 200 rows are larger than of 64";
    }
  }
}

// A GEMM with a dimension of 0 reads nothing (cuBLAS is not called): its
// spans are 0, not a wrapped-around count.
TEST(GpuWorkspace, AnEmptyOperandSpansNothing) {
  EXPECT_EQ(ops::gemm_input_spans(false, true, 0, 5, 3, 3, 3), std::make_pair(size_t(0), size_t(15)));  // B: 4 * 3 + 3
  EXPECT_EQ(ops::gemm_input_spans(false, false, 4, 5, 0, 0, 5), std::make_pair(size_t(0), size_t(0)));
  EXPECT_EQ(ops::gemm_span(3, 4, 10, 100, 0), 0u);
  EXPECT_EQ(ops::gemm_span(3, 4, 10, 100, 2), 124u);  // 100 + 2 * 10 + 4
}
