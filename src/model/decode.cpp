// Inference with a key/value cache (model/decode.h).
#include "model/decode.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "ops/blas.h"

namespace meshlm {

namespace {

// Query rows of one head whose scores against the cache are one GEMM.
constexpr int kAttnRows = 64;

// y(OC) = W(OC, IC) x(IC) (+ y when accumulate): one row's product as a
// matrix-vector product. OpenBLAS's GEMM packs all of W for a single row
// (GPT-2's classifier: 3x the time of the GEMV on 2 cores), and one row is
// what every decoding step is.
void gemv(float* y, const float* W, const float* x, int OC, int IC, size_t ldw, bool accumulate) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, IC, 1.0f, W, static_cast<int>(ldw), x, 1,
              accumulate ? 1.0f : 0.0f, y, 1);
}

}  // namespace

// out(n, OC) = inp(n, IC) w(OC, IC)^T + bias: the training op, or for one
// row its GEMV.
void Decoder::linear(float* out, const float* inp, const float* w, const float* bias, int n,
                     int IC, int OC) const {
  if (n != 1) {
    k_->matmul_forward(out, inp, w, bias, n, IC, OC);
    return;
  }
  if (bias) std::memcpy(out, bias, static_cast<size_t>(OC) * sizeof(float));
  gemv(out, w, inp, OC, IC, static_cast<size_t>(IC), bias != nullptr);
}

Decoder::Decoder(const GPTConfig& cfg, int context, int chunk_rows, const ops::Kernels& kernels)
    : cfg_(cfg), context_(context), chunk_(chunk_rows), k_(&kernels), table_(model_param_table(cfg)) {
  MESHLM_CHECK(k_->device() == Device::cpu, "the cached decoder runs on the CPU backend only");
  MESHLM_CHECK(context_ >= 1 && context_ <= cfg_.max_seq_len, "context outside [1, max_seq_len]");
  MESHLM_CHECK(chunk_ >= 1, "chunk_rows must be positive");
  llama_ = cfg_.arch == ModelArch::llama;
  C_ = cfg_.n_embd;
  HS_ = cfg_.head_size();
  NH_ = cfg_.n_head;
  NKV_ = cfg_.kv_heads();
  Ckv_ = NKV_ * HS_;
  F_ = cfg_.mlp_width();
  Vp_ = cfg_.padded_vocab_size();
  params_ = Buffer(table_numel(table_) * sizeof(float), MemCategory::params, "decode.params");
  cache_ = Buffer(2 * size_t(cfg_.n_layer) * context_ * Ckv_ * sizeof(float), MemCategory::activations,
                  "decode.kv_cache");
  threads_ = std::max(1, omp_get_max_threads());
  const size_t R = static_cast<size_t>(chunk_), half = static_cast<size_t>(HS_ / 2);
  const size_t qf = llama_ ? R * C_ : R * 3 * C_, kvf = llama_ ? R * Ckv_ : 0;
  const size_t rope = llama_ ? size_t(context_) * half : 0;
  const size_t scores = size_t(threads_) * kAttnRows * context_;
  const size_t sizes[] = {R * C_, R * C_, qf, kvf, kvf, R * C_, R * C_, R * F_, R * F_, R, R,
                          rope, rope, scores};
  size_t total = 0;
  for (size_t s : sizes) total += (s + 15) / 16 * 16;  // 64-byte aligned arrays
  work_ = Buffer(total * sizeof(float), MemCategory::workspace, "decode.scratch");
  float* at = work_.as<float>();
  float** arrays[] = {&x_, &ln_, &q_, &kk_, &vv_, &atty_, &proj_, &fc_, &fc2_, &mean_, &rstd_,
                      &rope_cos_, &rope_sin_, &scores_};
  for (size_t i = 0; i < std::size(arrays); ++i) {
    *arrays[i] = at;
    at += (sizes[i] + 15) / 16 * 16;
  }
  if (llama_) {
    std::vector<float> inv(half);
    ops::rope_inv_freq(inv.data(), HS_, cfg_.rope_theta, cfg_.rope_scaling);
    ops::rope_tables(rope_cos_, rope_sin_, inv.data(), context_, HS_);
  }
  find_tensors();
}

void Decoder::find_tensors() {
  float* base = params();
  layers_.assign(cfg_.n_layer, Layer{});
  for (const ParamSpec& p : table_) {
    const float* t = base + p.offset;
    Layer* L = p.layer >= 0 ? &layers_[p.layer] : nullptr;
    switch (p.role) {
      case ParamRole::token_embedding: wte_ = t; break;
      case ParamRole::position_embedding: wpe_ = t; break;
      case ParamRole::lnf_weight: lnfw_ = t; break;
      case ParamRole::lnf_bias: lnfb_ = t; break;
      case ParamRole::lm_head: cls_ = t; break;
      case ParamRole::ln1_weight: L->ln1w = t; break;
      case ParamRole::ln1_bias: L->ln1b = t; break;
      case ParamRole::ln2_weight: L->ln2w = t; break;
      case ParamRole::ln2_bias: L->ln2b = t; break;
      case ParamRole::linear_weight: L->w[static_cast<int>(*p.slot)] = t; break;
      case ParamRole::linear_bias: L->b[static_cast<int>(*p.slot)] = t; break;
      case ParamRole::lora_a:
      case ParamRole::lora_b: MESHLM_CHECK(false, "a model table holds no adapters"); break;
    }
  }
  if (cfg_.tied_classifier()) cls_ = wte_;
  MESHLM_CHECK(wte_ && cls_ && lnfw_ && (llama_ || (wpe_ && lnfb_)),
               "the model's table lacks a tensor outside the blocks");
}

void Decoder::forward(const int32_t* tokens, int n, float* logits, bool all_rows) {
  if (n < 1) throw RankError("decode: no tokens to run", MESHLM_HERE);
  if (pos_ + n > context_)
    throw RankError("decode: " + std::to_string(pos_) + " positions cached and " +
                        std::to_string(n) + " more exceed the context of " +
                        std::to_string(context_),
                    MESHLM_HERE);
  for (int i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
      throw RankError("decode: token id " + std::to_string(tokens[i]) +
                          " is outside the model's vocabulary [0, " +
                          std::to_string(cfg_.vocab_size) + ")",
                      MESHLM_HERE);
  for (int i0 = 0; i0 < n; i0 += chunk_) {
    const int m = std::min(chunk_, n - i0);
    const bool last = i0 + m == n;
    float* out = all_rows ? logits + static_cast<size_t>(i0) * Vp_ : (last ? logits : nullptr);
    forward_rows(tokens + i0, m, out, all_rows);
  }
}

// n <= chunk_ rows at positions [pos_, pos_ + n); logits of every row
// (all_rows) or of the last, when `logits` is not null.
void Decoder::forward_rows(const int32_t* tokens, int n, float* logits, bool all_rows) {
  const size_t nC = static_cast<size_t>(n) * C_;
  k_->embedding_forward(x_, tokens, wte_, n, C_, 0, Vp_);
  if (!llama_) k_->position_forward(x_, wpe_ + static_cast<size_t>(pos_) * C_, 1, n, C_);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (llama_)
      llama_block(layers_[l], l, n);
    else
      gpt2_block(layers_[l], l, n);
  }
  pos_ += n;
  if (logits == nullptr) return;
  // The final norm and the classifier of the rows asked for.
  const int rows = all_rows ? n : 1;
  const float* xr = x_ + (nC - static_cast<size_t>(rows) * C_);
  if (llama_)
    k_->rmsnorm_forward(ln_, rstd_, xr, lnfw_, rows, C_, cfg_.norm_eps);
  else
    k_->layernorm_forward(ln_, mean_, rstd_, xr, lnfw_, lnfb_, rows, C_);
  linear(logits, ln_, cls_, nullptr, rows, C_, Vp_);
}

void Decoder::gpt2_block(const Layer& w, int l, int n) {
  const size_t nC = static_cast<size_t>(n) * C_;
  const int qkv = static_cast<int>(LinearSlot::qkv), out = static_cast<int>(LinearSlot::attn_out);
  const int up = static_cast<int>(LinearSlot::mlp_up), down = static_cast<int>(LinearSlot::mlp_down);
  k_->layernorm_forward(ln_, mean_, rstd_, x_, w.ln1w, w.ln1b, n, C_);
  linear(q_, ln_, w.w[qkv], w.b[qkv], n, C_, 3 * C_);
  const size_t ld = 3 * static_cast<size_t>(C_);
  append_kv(l, q_ + C_, q_ + 2 * C_, ld, n);
  attend(l, q_, ld, n);
  linear(proj_, atty_, w.w[out], w.b[out], n, C_, C_);
  k_->residual_forward(x_, x_, proj_, nC);
  k_->layernorm_forward(ln_, mean_, rstd_, x_, w.ln2w, w.ln2b, n, C_);
  linear(fc_, ln_, w.w[up], w.b[up], n, C_, F_);
  k_->gelu_forward(fc2_, fc_, static_cast<size_t>(n) * F_);
  linear(proj_, fc2_, w.w[down], w.b[down], n, F_, C_);
  k_->residual_forward(x_, x_, proj_, nC);
}

void Decoder::llama_block(const Layer& w, int l, int n) {
  const size_t nC = static_cast<size_t>(n) * C_, half = static_cast<size_t>(HS_ / 2);
  auto W = [&](LinearSlot s) { return w.w[static_cast<int>(s)]; };
  const double eps = cfg_.norm_eps;
  k_->rmsnorm_forward(ln_, rstd_, x_, w.ln1w, n, C_, eps);
  linear(q_, ln_, W(LinearSlot::q), nullptr, n, C_, C_);
  linear(kk_, ln_, W(LinearSlot::k), nullptr, n, C_, Ckv_);
  linear(vv_, ln_, W(LinearSlot::v), nullptr, n, C_, Ckv_);
  // The tables' rows of positions [pos_, pos_ + n).
  const float* cos = rope_cos_ + pos_ * half;
  const float* sin = rope_sin_ + pos_ * half;
  k_->rope_forward(q_, cos, sin, 1, n, NH_, HS_, static_cast<size_t>(C_));
  k_->rope_forward(kk_, cos, sin, 1, n, NKV_, HS_, static_cast<size_t>(Ckv_));
  append_kv(l, kk_, vv_, static_cast<size_t>(Ckv_), n);
  attend(l, q_, static_cast<size_t>(C_), n);
  linear(proj_, atty_, W(LinearSlot::o), nullptr, n, C_, C_);
  k_->residual_forward(x_, x_, proj_, nC);
  k_->rmsnorm_forward(ln_, rstd_, x_, w.ln2w, n, C_, eps);
  linear(fc_, ln_, W(LinearSlot::gate), nullptr, n, C_, F_);
  linear(fc2_, ln_, W(LinearSlot::up), nullptr, n, C_, F_);
  k_->swiglu_forward(fc_, fc_, fc2_, n, F_, static_cast<size_t>(F_));
  linear(proj_, fc_, W(LinearSlot::down), nullptr, n, F_, C_);
  k_->residual_forward(x_, x_, proj_, nC);
}

void Decoder::append_kv(int l, const float* k, const float* v, size_t ld, int n) {
  const size_t plane = static_cast<size_t>(context_) * Ckv_;
  float* K = cache_.as<float>() + 2 * static_cast<size_t>(l) * plane;
  float* V = K + plane;
  for (int i = 0; i < n; ++i) {
    const size_t to = static_cast<size_t>(pos_ + i) * Ckv_;
    std::memcpy(K + to, k + i * ld, Ckv_ * sizeof(float));
    std::memcpy(V + to, v + i * ld, Ckv_ * sizeof(float));
  }
}

void Decoder::attend(int l, const float* q, size_t ldq, int n) {
  const size_t plane = static_cast<size_t>(context_) * Ckv_;
  const float* K = cache_.as<float>() + 2 * static_cast<size_t>(l) * plane;
  const float* V = K + plane;
  const int group = NH_ / NKV_, blocks = (n + kAttnRows - 1) / kAttnRows, p0 = pos_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS_));
  const ops::Kernels& k = *k_;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(threads_)
  for (int h = 0; h < NH_; ++h) {
    for (int b = 0; b < blocks; ++b) {
      float* s = scores_ + static_cast<size_t>(omp_get_thread_num()) * kAttnRows * context_;
      const int i0 = b * kAttnRows, rows = std::min(kAttnRows, n - i0);
      const int keys = p0 + i0 + rows;  // the block's last row sees them all
      const size_t kv = static_cast<size_t>(h / group) * HS_;
      // S = scale Q_blk K^T over the keys the block's rows can see (one
      // row, a decoding step's: K q).
      const float* qh = q + i0 * ldq + static_cast<size_t>(h) * HS_;
      if (rows == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, keys, HS_, scale, K + kv, Ckv_, qh, 1, 0.0f, s, 1);
      else
        k.gemm(false, true, rows, keys, HS_, scale, qh, static_cast<int>(ldq), K + kv, Ckv_, 0.0f, s,
               keys);
      for (int i = 0; i < rows; ++i) {
        float* row = s + static_cast<size_t>(i) * keys;
        const int last = p0 + i0 + i;  // this row's position: it sees keys [0, last]
        float mx = row[0];
        for (int j = 1; j <= last; ++j) mx = std::max(mx, row[j]);
        float sum = 0;
        for (int j = 0; j <= last; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j <= last; ++j) row[j] *= inv;
        for (int j = last + 1; j < keys; ++j) row[j] = 0;
      }
      float* y = atty_ + static_cast<size_t>(i0) * C_ + static_cast<size_t>(h) * HS_;
      if (rows == 1)  // y = V^T p
        cblas_sgemv(CblasRowMajor, CblasTrans, keys, HS_, 1.0f, V + kv, Ckv_, s, 1, 0.0f, y, 1);
      else
        k.gemm(false, false, rows, HS_, keys, 1.0f, s, keys, V + kv, Ckv_, 0.0f, y, C_);
    }
  }
}

}  // namespace meshlm
