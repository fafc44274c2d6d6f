#include "model/gpt.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace meshlm {

void GPTConfig::validate() const {
  auto fail = [](const std::string& m) { throw CollectiveError(m, MESHLM_HERE); };
  if (n_layer < 1) fail("model.n_layer must be >= 1 (got " + std::to_string(n_layer) + ")");
  if (n_head < 1) fail("model.n_head must be >= 1 (got " + std::to_string(n_head) + ")");
  if (n_embd < 1) fail("model.n_embd must be >= 1 (got " + std::to_string(n_embd) + ")");
  if (n_embd % n_head != 0)
    fail("model.n_embd (" + std::to_string(n_embd) + ") must be divisible by model.n_head (" +
         std::to_string(n_head) + ")");
  if (vocab_size < 2) fail("model.vocab_size must be >= 2 (got " + std::to_string(vocab_size) + ")");
  if (max_seq_len < 1) fail("model.max_seq_len must be >= 1 (got " + std::to_string(max_seq_len) + ")");
}

std::vector<ParamSpec> gpt_param_table(const GPTConfig& cfg) {
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab_size(), maxT = cfg.max_seq_len;
  std::vector<ParamSpec> t;
  size_t offset = 0;
  auto add = [&](std::string name, Shape shape, int tp_dim, int layer) {
    ParamSpec p{std::move(name), shape, offset, tp_dim, layer};
    offset += p.numel();
    t.push_back(std::move(p));
  };
  // Vocabulary-parallel embedding: TP splits the rows of wte (and so the
  // logits of the tied lm_head). Column-parallel layers (c_attn, c_fc) split
  // their output rows (dim 0); row-parallel ones (c_proj) their input (dim 1).
  add("wte.weight", {Vp, C}, 0, -1);
  add("wpe.weight", {maxT, C}, -1, -1);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C}, -1, l);
    add(h + "ln_1.bias", {C}, -1, l);
    add(h + "attn.c_attn.weight", {3 * C, C}, 0, l);
    add(h + "attn.c_attn.bias", {3 * C}, 0, l);
    add(h + "attn.c_proj.weight", {C, C}, 1, l);
    add(h + "attn.c_proj.bias", {C}, -1, l);
    add(h + "ln_2.weight", {C}, -1, l);
    add(h + "ln_2.bias", {C}, -1, l);
    add(h + "mlp.c_fc.weight", {4 * C, C}, 0, l);
    add(h + "mlp.c_fc.bias", {4 * C}, 0, l);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, 1, l);
    add(h + "mlp.c_proj.bias", {C}, -1, l);
  }
  add("ln_f.weight", {C}, -1, -1);
  add("ln_f.bias", {C}, -1, -1);
  return t;
}

size_t table_numel(const std::vector<ParamSpec>& table) {
  return table.empty() ? 0 : table.back().offset + table.back().numel();
}

GPT::GPT(const GPTConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  table_ = gpt_param_table(cfg_);
  num_params_ = table_numel(table_);
  params_ = Buffer(num_params_ * sizeof(float), MemCategory::params, "gpt.params");
  grads_ = Buffer(num_params_ * sizeof(float), MemCategory::grads, "gpt.grads");
}

const ParamSpec& GPT::spec(const std::string& name) const {
  for (const auto& p : table_)
    if (p.name == name) return p;
  throw RankError("no parameter named '" + name + "' in the GPT-2 table", MESHLM_HERE);
}

std::span<float> GPT::view(float* base, const std::string& name) const {
  const TensorView t = spec(name).in(base);
  return {t.as<float>(), static_cast<size_t>(t.numel())};
}

GPTTensors GPT::tensors(float* base) const {
  // The table order is fixed by gpt_param_table(): 2 embeddings, 12 tensors
  // per block, 2 for ln_f.
  constexpr size_t kPerBlock = 12;
  auto at = [&](size_t i) { return base + table_[i].offset; };
  GPTTensors t;
  t.wte = at(0);
  t.wpe = at(1);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    size_t i = 2 + l * kPerBlock;
    t.blocks.push_back({at(i), at(i + 1), at(i + 2), at(i + 3), at(i + 4), at(i + 5), at(i + 6),
                        at(i + 7), at(i + 8), at(i + 9), at(i + 10), at(i + 11)});
  }
  size_t f = 2 + cfg_.n_layer * kPerBlock;
  t.lnfw = at(f);
  t.lnfb = at(f + 1);
  return t;
}

void GPT::init_weights(uint64_t seed) {
  const double kStd = 0.02;
  const double kResidualStd = kStd / std::sqrt(2.0 * cfg_.n_layer);
  const size_t real_wte = static_cast<size_t>(cfg_.vocab_size) * cfg_.n_embd;
  float* base = params();
  for (size_t i = 0; i < table_.size(); ++i) {
    const ParamSpec& p = table_[i];
    float* x = base + p.offset;
    Rng rng(Rng::mix_seed(seed, i));
    const bool is_ln_gain = p.name.find("ln_") != std::string::npos && p.name.ends_with(".weight");
    if (p.decay()) {
      const double sd = p.name.ends_with("c_proj.weight") ? kResidualStd : kStd;
      size_t n = (p.name == "wte.weight") ? real_wte : p.numel();  // padded rows stay 0
      for (size_t j = 0; j < n; ++j) x[j] = static_cast<float>(sd * rng.normal());
      for (size_t j = n; j < p.numel(); ++j) x[j] = 0.0f;
    } else {
      const float v = is_ln_gain ? 1.0f : 0.0f;
      for (size_t j = 0; j < p.numel(); ++j) x[j] = v;
    }
  }
}

size_t GPT::activation_bytes(const GPTConfig& cfg, int B, int Tn) {
  const size_t BT = static_cast<size_t>(B) * Tn, C = cfg.n_embd, NH = cfg.n_head;
  const size_t Vp = cfg.padded_vocab_size();
  const size_t per_block = BT * C * 7 + BT * 4 + BT * 3 * C + BT * NH * Tn + BT * 4 * C * 2;
  const size_t acts = BT * C + cfg.n_layer * per_block + BT * C + BT * 2 + BT * Vp + BT;
  const size_t grads = BT * C * 3 + BT * 3 * C + BT * NH * Tn + BT * 4 * C * 2 + BT;
  return (acts + grads) * sizeof(float);
}

void GPT::ensure_activations(int B, int Tn) {
  if (B == B_ && Tn == T_) return;
  MESHLM_CHECK(Tn <= cfg_.max_seq_len, "sequence longer than the position table");
  const size_t BT = static_cast<size_t>(B) * Tn, C = cfg_.n_embd, NH = cfg_.n_head;
  const size_t Vp = cfg_.padded_vocab_size();
  // Cut one buffer into the arrays, in order; the sizes here and in
  // activation_bytes() are the same list.
  size_t total = 0;
  std::vector<std::pair<float**, size_t>> cuts;
  auto cut = [&](float*& p, size_t n) {
    cuts.emplace_back(&p, n);
    total += n;
  };
  acts_.blocks.assign(cfg_.n_layer, BlockActs{});
  cut(acts_.encoded, BT * C);
  for (auto& a : acts_.blocks) {
    cut(a.ln1, BT * C);
    cut(a.ln1_mean, BT);
    cut(a.ln1_rstd, BT);
    cut(a.qkv, BT * 3 * C);
    cut(a.atty, BT * C);
    cut(a.att, BT * NH * Tn);
    cut(a.attproj, BT * C);
    cut(a.res2, BT * C);
    cut(a.ln2, BT * C);
    cut(a.ln2_mean, BT);
    cut(a.ln2_rstd, BT);
    cut(a.fch, BT * 4 * C);
    cut(a.fch_gelu, BT * 4 * C);
    cut(a.fcproj, BT * C);
    cut(a.res3, BT * C);
  }
  cut(acts_.lnf, BT * C);
  cut(acts_.lnf_mean, BT);
  cut(acts_.lnf_rstd, BT);
  cut(acts_.probs, BT * Vp);
  cut(acts_.losses, BT);
  const size_t act_total = total;
  cut(gacts_.dres, BT * C);
  cut(gacts_.dln, BT * C);
  cut(gacts_.dqkv, BT * 3 * C);
  cut(gacts_.datty, BT * C);
  cut(gacts_.datt, BT * NH * Tn);
  cut(gacts_.dfch, BT * 4 * C);
  cut(gacts_.dfch_gelu, BT * 4 * C);
  cut(gacts_.dlosses, BT);
  MESHLM_CHECK(total * sizeof(float) == activation_bytes(cfg_, B, Tn), "activation size mismatch");

  act_buf_ = Buffer();
  grad_act_buf_ = Buffer();
  act_buf_ = Buffer(act_total * sizeof(float), MemCategory::activations, "gpt.activations");
  grad_act_buf_ = Buffer((total - act_total) * sizeof(float), MemCategory::activations,
                         "gpt.activation_grads");
  size_t off = 0;
  for (auto& [ptr, n] : cuts) {
    *ptr = (off < act_total) ? act_buf_.as<float>() + off
                             : grad_act_buf_.as<float>() + (off - act_total);
    off += n;
  }
  B_ = B;
  T_ = Tn;
}

float GPT::forward(const int32_t* tokens, const int32_t* targets, int B, int Tn) {
  ensure_activations(B, Tn);
  const int C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size();
  const int N = B * Tn;
  tokens_.assign(tokens, tokens + N);
  targets_.assign(targets, targets + N);
  for (int i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V || targets[i] < 0 || targets[i] >= V)
      throw RankError("token id out of range [0, model.vocab_size=" + std::to_string(V) +
                          ") at position " + std::to_string(i) + " of the micro-batch",
                      MESHLM_HERE);
  }
  const GPTTensors p = tensors(params());

  ops::encoder_forward(acts_.encoded, tokens, p.wte, p.wpe, B, Tn, C);
  const float* x = acts_.encoded;  // (B,T,C) the residual stream entering the block
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const BlockTensors& w = p.blocks[l];
    BlockActs& a = acts_.blocks[l];
    ops::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1w, w.ln1b, N, C);
    ops::matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, N, C, 3 * C);
    ops::attention_forward(a.atty, a.att, a.qkv, B, Tn, C, NH);
    ops::matmul_forward(a.attproj, a.atty, w.attprojw, w.attprojb, N, C, C);
    ops::residual_forward(a.res2, x, a.attproj, static_cast<size_t>(N) * C);
    ops::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2w, w.ln2b, N, C);
    ops::matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, N, C, 4 * C);
    ops::gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * 4 * C);
    ops::matmul_forward(a.fcproj, a.fch_gelu, w.fcprojw, w.fcprojb, N, 4 * C, C);
    ops::residual_forward(a.res3, a.res2, a.fcproj, static_cast<size_t>(N) * C);
    x = a.res3;
  }
  ops::layernorm_forward(acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, x, p.lnfw, p.lnfb, N, C);
  // lm_head tied to wte: logits(N,Vp) = lnf(N,C) wte(Vp,C)^T
  ops::matmul_forward<float>(acts_.probs, acts_.lnf, p.wte, nullptr, N, C, Vp);
  ops::softmax_crossentropy_forward(acts_.losses, acts_.probs, targets, N, V, Vp);
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += acts_.losses[i];
  have_forward_ = true;
  return static_cast<float>(sum / N);
}

void GPT::zero_grads() { std::memset(grads(), 0, num_params_ * sizeof(float)); }

void GPT::backward(float loss_scale) {
  MESHLM_CHECK(have_forward_, "backward() needs a forward() of its own first");
  const int B = B_, Tn = T_;
  const int C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size, Vp = cfg_.padded_vocab_size();
  const int N = B * Tn;
  const size_t NC = static_cast<size_t>(N) * C;
  const GPTTensors p = tensors(params());
  const GPTTensors g = tensors(grads());
  auto zero = [](float* a, size_t n) { std::memset(a, 0, n * sizeof(float)); };

  // Loss = loss_scale * mean_n losses[n]
  const float dl = loss_scale / static_cast<float>(N);
  for (int i = 0; i < N; ++i) gacts_.dlosses[i] = dl;
  ops::softmax_crossentropy_backward(acts_.probs, gacts_.dlosses, targets_.data(), N, V, Vp);
  float* dlogits = acts_.probs;  // (N,Vp), in place

  // lm_head: dlnf = dlogits wte ; dwte += dlogits^T lnf
  zero(gacts_.dln, NC);
  ops::matmul_backward<float>(gacts_.dln, g.wte, nullptr, dlogits, acts_.lnf, p.wte, N, C, Vp);
  const float* x_last = acts_.blocks.back().res3;
  zero(gacts_.dres, NC);
  ops::layernorm_backward(gacts_.dres, g.lnfw, g.lnfb, gacts_.dln, x_last, p.lnfw, acts_.lnf_mean,
                          acts_.lnf_rstd, N, C);

  // dres holds d loss / d (output of block l); walking down, the residual
  // adds pass it through unchanged and each branch accumulates into it.
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const BlockTensors& w = p.blocks[l];
    const BlockTensors& gw = g.blocks[l];
    BlockActs& a = acts_.blocks[l];
    const float* x = (l == 0) ? acts_.encoded : acts_.blocks[l - 1].res3;

    // MLP branch: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2))))
    zero(gacts_.dfch_gelu, 4 * NC);
    ops::matmul_backward(gacts_.dfch_gelu, gw.fcprojw, gw.fcprojb, gacts_.dres, a.fch_gelu,
                         w.fcprojw, N, 4 * C, C);
    zero(gacts_.dfch, 4 * NC);
    ops::gelu_backward(gacts_.dfch, a.fch, gacts_.dfch_gelu, 4 * NC);
    zero(gacts_.dln, NC);
    ops::matmul_backward(gacts_.dln, gw.fcw, gw.fcb, gacts_.dfch, a.ln2, w.fcw, N, C, 4 * C);
    ops::layernorm_backward(gacts_.dres, gw.ln2w, gw.ln2b, gacts_.dln, a.res2, w.ln2w, a.ln2_mean,
                            a.ln2_rstd, N, C);

    // Attention branch: res2 = x + c_proj(attn(c_attn(ln_1(x))))
    zero(gacts_.datty, NC);
    ops::matmul_backward(gacts_.datty, gw.attprojw, gw.attprojb, gacts_.dres, a.atty, w.attprojw,
                         N, C, C);
    zero(gacts_.dqkv, 3 * NC);
    ops::attention_backward(gacts_.dqkv, gacts_.datt, gacts_.datty, a.qkv, a.att, B, Tn, C, NH);
    zero(gacts_.dln, NC);
    ops::matmul_backward(gacts_.dln, gw.qkvw, gw.qkvb, gacts_.dqkv, a.ln1, w.qkvw, N, C, 3 * C);
    ops::layernorm_backward(gacts_.dres, gw.ln1w, gw.ln1b, gacts_.dln, x, w.ln1w, a.ln1_mean,
                            a.ln1_rstd, N, C);
  }
  ops::encoder_backward(g.wte, g.wpe, gacts_.dres, tokens_.data(), B, Tn, C);
  // probs now hold dlogits: a second backward() needs a new forward().
  have_forward_ = false;
}

}  // namespace meshlm
