// Inference with a key/value cache (model/decode.h).
#include "model/decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "ops/blas.h"

namespace meshlm {

namespace {

// y(OC) = W(OC, IC) x(IC) (+ y when accumulate): one row's product as a
// matrix-vector product. OpenBLAS's GEMM packs all of W for a single row
// (GPT-2's classifier: 3x the time of the GEMV on 2 cores), and one row is
// what every decoding step is.
void gemv(float* y, const float* W, const float* x, int OC, int IC, size_t ldw, bool accumulate) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, IC, 1.0f, W, static_cast<int>(ldw), x, 1,
              accumulate ? 1.0f : 0.0f, y, 1);
}

}  // namespace

// out(n, OC) = inp(n, IC) w(OC, IC)^T + bias: the training op, or on the
// CPU at fp32 for one row its GEMV.
void Decoder::linear(float* out, const float* inp, const float* w, const float* bias, int n,
                     int IC, int OC) const {
  if (n != 1 || !on_host_ || k_->precision() != ops::Precision::fp32) {
    k_->matmul_forward(out, inp, w, bias, n, IC, OC);
    return;
  }
  if (bias) std::memcpy(out, bias, static_cast<size_t>(OC) * sizeof(float));
  gemv(out, w, inp, OC, IC, static_cast<size_t>(IC), bias != nullptr);
}

Decoder::Decoder(const GPTConfig& cfg, int context, int chunk_rows, const ops::Kernels& kernels)
    : cfg_(cfg), context_(context), chunk_(chunk_rows), k_(&kernels),
      on_host_(kernels.device() == Device::cpu), table_(model_param_table(cfg)) {
  MESHLM_CHECK(context_ >= 1 && context_ <= cfg_.max_seq_len, "context outside [1, max_seq_len]");
  MESHLM_CHECK(chunk_ >= 1, "chunk_rows must be positive");
  const Device dev = k_->device();
  llama_ = cfg_.arch == ModelArch::llama;
  C_ = cfg_.n_embd;
  HS_ = cfg_.head_size();
  NH_ = cfg_.n_head;
  NKV_ = cfg_.kv_heads();
  Ckv_ = NKV_ * HS_;
  F_ = cfg_.mlp_width();
  Vp_ = cfg_.padded_vocab_size();
  params_ = Buffer(table_numel(table_) * sizeof(float), MemCategory::params, "decode.params", dev);
  cache_ = Buffer(2 * size_t(cfg_.n_layer) * context_ * Ckv_ * sizeof(float),
                  MemCategory::activations, "decode.kv_cache", dev);
  const size_t R = static_cast<size_t>(chunk_), half = static_cast<size_t>(HS_ / 2);
  const size_t qf = llama_ ? R * C_ : R * 3 * C_, kvf = llama_ ? R * Ckv_ : 0;
  const size_t rope = llama_ ? size_t(context_) * half : 0;
  scores_floats_ = k_->cached_attention_scratch(chunk_, context_, NH_);
  const size_t ids = on_host_ ? 0 : R;  // int32s, as many floats
  const size_t sizes[] = {R * C_, R * C_, qf, kvf, kvf, R * C_, R * C_, R * F_, R * F_, R, R,
                          rope, rope, scores_floats_, ids};
  size_t total = 0;
  for (size_t s : sizes) total += (s + 15) / 16 * 16;  // 64-byte aligned arrays
  work_ = Buffer(total * sizeof(float), MemCategory::workspace, "decode.scratch", dev);
  float* at = work_.as<float>();
  float* id_floats = nullptr;
  float** arrays[] = {&x_, &ln_, &q_, &kk_, &vv_, &atty_, &proj_, &fc_, &fc2_, &mean_, &rstd_,
                      &rope_cos_, &rope_sin_, &scores_, &id_floats};
  for (size_t i = 0; i < std::size(arrays); ++i) {
    *arrays[i] = at;
    at += (sizes[i] + 15) / 16 * 16;
  }
  ids_ = reinterpret_cast<int32_t*>(id_floats);
  if (llama_) {
    std::vector<float> inv(half), cos(rope), sin(rope);
    ops::rope_inv_freq(inv.data(), HS_, cfg_.rope_theta, cfg_.rope_scaling);
    ops::rope_tables(cos.data(), sin.data(), inv.data(), context_, HS_);
    k_->upload(rope_cos_, cos.data(), rope * sizeof(float));
    k_->upload(rope_sin_, sin.data(), rope * sizeof(float));
  }
  find_tensors();
}

void Decoder::load(const TensorReader& read) {
  if (on_host_) {
    for (const ParamSpec& p : table_) read(p, params() + p.offset);
    return;
  }
  size_t largest = 0;
  for (const ParamSpec& p : table_) largest = std::max(largest, p.numel());
  const Buffer host(largest * sizeof(float), MemCategory::workspace, "decode.load_staging");
  for (const ParamSpec& p : table_) {
    read(p, host.as<float>());
    k_->upload(params() + p.offset, host.data(), p.numel() * sizeof(float));
  }
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
// (all_rows) or of the last, when `logits` (host memory) is not null.
void Decoder::forward_rows(const int32_t* tokens, int n, float* logits, bool all_rows) {
  const size_t nC = static_cast<size_t>(n) * C_;
  const int32_t* ids = tokens;
  if (!on_host_) {
    k_->upload(ids_, tokens, static_cast<size_t>(n) * sizeof(int32_t));
    ids = ids_;
  }
  k_->embedding_forward(x_, ids, wte_, n, C_, 0, Vp_);
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
  const size_t bytes = static_cast<size_t>(rows) * Vp_ * sizeof(float);
  if (on_host_) {
    linear(logits, ln_, cls_, nullptr, rows, C_, Vp_);
    return;
  }
  if (logits_.bytes() < bytes)
    logits_ = Buffer(bytes, MemCategory::workspace, "decode.logits", k_->device());
  linear(logits_.as<float>(), ln_, cls_, nullptr, rows, C_, Vp_);
  k_->download(logits, logits_.data(), bytes);
}

void Decoder::gpt2_block(const Layer& w, int l, int n) {
  const size_t nC = static_cast<size_t>(n) * C_;
  const int qkv = static_cast<int>(LinearSlot::qkv), out = static_cast<int>(LinearSlot::attn_out);
  const int up = static_cast<int>(LinearSlot::mlp_up), down = static_cast<int>(LinearSlot::mlp_down);
  k_->layernorm_forward(ln_, mean_, rstd_, x_, w.ln1w, w.ln1b, n, C_);
  linear(q_, ln_, w.w[qkv], w.b[qkv], n, C_, 3 * C_);
  const size_t ld = 3 * static_cast<size_t>(C_);
  attend(l, q_, ld, q_ + C_, q_ + 2 * C_, ld, n);
  linear(proj_, atty_, w.w[out], w.b[out], n, C_, C_);
  k_->residual_layernorm_forward(x_, ln_, mean_, rstd_, x_, proj_, w.ln2w, w.ln2b, n, C_);
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
  attend(l, q_, static_cast<size_t>(C_), kk_, vv_, static_cast<size_t>(Ckv_), n);
  linear(proj_, atty_, W(LinearSlot::o), nullptr, n, C_, C_);
  k_->residual_rmsnorm_forward(x_, ln_, rstd_, x_, proj_, w.ln2w, n, C_, eps);
  linear(fc_, ln_, W(LinearSlot::gate), nullptr, n, C_, F_);
  linear(fc2_, ln_, W(LinearSlot::up), nullptr, n, C_, F_);
  k_->swiglu_forward(fc_, fc_, fc2_, n, F_, static_cast<size_t>(F_));
  linear(proj_, fc_, W(LinearSlot::down), nullptr, n, F_, C_);
  k_->residual_forward(x_, x_, proj_, nC);
}

void Decoder::attend(int l, const float* q, size_t ldq, const float* k, const float* v, size_t ld,
                     int n) {
  const size_t plane = static_cast<size_t>(context_) * Ckv_;
  float* K = cache_.as<float>() + 2 * static_cast<size_t>(l) * plane;
  k_->cached_attention_forward(atty_, K, K + plane, q, ldq, k, v, ld, n, pos_, NH_, NKV_, HS_,
                               scores_, scores_floats_);
}

}  // namespace meshlm
