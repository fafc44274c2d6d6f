// The GPT-2 model as a whole: the parameter table, determinism, memory
// accounting and the ability to learn. Its loss and gradients against
// PyTorch are checked by tests/torch/check_gpt2_grads.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "ops/timed_kernels.h"
#include "train/adamw.h"

using namespace meshlm;

namespace {
GPTConfig small_config(int V = 64) {
  return {.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = V, .max_seq_len = 16};
}

void random_batch(std::vector<int32_t>& tok, std::vector<int32_t>& tgt, int V, uint64_t seed) {
  Rng r(seed);
  for (auto& t : tok) t = static_cast<int32_t>(r.below(V));
  for (auto& t : tgt) t = static_cast<int32_t>(r.below(V));
}
}  // namespace

TEST(GPTTable, GPT2SmallHas124MParameters) {
  const GPTConfig c{
      .n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257, .max_seq_len = 1024};
  EXPECT_EQ(c.padded_vocab_size(), 50304);
  const auto table = gpt_param_table(c);
  // GPT-2 small: 124,439,808 parameters with V = 50257; padding adds 47 rows.
  EXPECT_EQ(table_numel(table), 124439808u + 47u * 768u);
  EXPECT_EQ(table.size(), 2u + 12u * 12u + 2u);
}

TEST(GPTTable, ContiguousUniqueNames) {
  const auto table = gpt_param_table(small_config());
  std::set<std::string> names;
  size_t offset = 0;
  for (const auto& p : table) {
    EXPECT_EQ(p.offset, offset) << p.name;
    offset += p.numel();
    EXPECT_TRUE(names.insert(p.name).second) << "duplicate " << p.name;
    if (p.tp_dim >= 0) EXPECT_LT(p.tp_dim, p.shape.ndim) << p.name;
  }
  EXPECT_TRUE(names.count("h.1.mlp.c_proj.weight"));
  EXPECT_EQ(table[0].name, "wte.weight");
  EXPECT_EQ(table[0].shape, (Shape{64, 32}));
}

// The roles the model finds tensors by, against the Hugging Face names the
// files use (written out here, independently of the table's code).
TEST(GPTTable, RolesAgreeWithTheHuggingFaceNames) {
  const GPTConfig cfg = small_config();
  struct Expect {
    ParamRole role;
    std::optional<LinearSlot> slot;
    InitKind init;
  };
  const std::map<std::string, Expect> block = {
      {"ln_1.weight", {ParamRole::ln1_weight, {}, InitKind::ones}},
      {"ln_1.bias", {ParamRole::ln1_bias, {}, InitKind::zeros}},
      {"attn.c_attn.weight", {ParamRole::linear_weight, LinearSlot::qkv, InitKind::normal}},
      {"attn.c_attn.bias", {ParamRole::linear_bias, LinearSlot::qkv, InitKind::zeros}},
      {"attn.c_proj.weight",
       {ParamRole::linear_weight, LinearSlot::attn_out, InitKind::normal_residual}},
      {"attn.c_proj.bias", {ParamRole::linear_bias, LinearSlot::attn_out, InitKind::zeros}},
      {"ln_2.weight", {ParamRole::ln2_weight, {}, InitKind::ones}},
      {"ln_2.bias", {ParamRole::ln2_bias, {}, InitKind::zeros}},
      {"mlp.c_fc.weight", {ParamRole::linear_weight, LinearSlot::mlp_up, InitKind::normal}},
      {"mlp.c_fc.bias", {ParamRole::linear_bias, LinearSlot::mlp_up, InitKind::zeros}},
      {"mlp.c_proj.weight",
       {ParamRole::linear_weight, LinearSlot::mlp_down, InitKind::normal_residual}},
      {"mlp.c_proj.bias", {ParamRole::linear_bias, LinearSlot::mlp_down, InitKind::zeros}},
  };
  const std::map<std::string, Expect> edge = {
      {"wte.weight", {ParamRole::token_embedding, {}, InitKind::normal_vocab}},
      {"wpe.weight", {ParamRole::position_embedding, {}, InitKind::normal}},
      {"ln_f.weight", {ParamRole::lnf_weight, {}, InitKind::ones}},
      {"ln_f.bias", {ParamRole::lnf_bias, {}, InitKind::zeros}},
  };
  const auto table = gpt_param_table(cfg);
  ASSERT_EQ(table.size(), edge.size() + block.size() * cfg.n_layer);
  for (const ParamSpec& p : table) {
    std::string key = p.name;
    if (p.layer >= 0) {
      const std::string prefix = "h." + std::to_string(p.layer) + ".";
      ASSERT_EQ(p.name.rfind(prefix, 0), 0u) << p.name;
      key = p.name.substr(prefix.size());
    }
    const auto& names = p.layer >= 0 ? block : edge;
    ASSERT_TRUE(names.count(key)) << p.name;
    const Expect& e = names.at(key);
    EXPECT_EQ(p.role, e.role) << p.name;
    EXPECT_EQ(p.slot, e.slot) << p.name;
    EXPECT_EQ(p.init, e.init) << p.name;
    EXPECT_EQ(p.tied, key == "wte.weight" ? TiedGroup::embedding : TiedGroup::none) << p.name;
  }
  ASSERT_NE(find_role(table, ParamRole::position_embedding), nullptr);
  EXPECT_EQ(find_role(table, ParamRole::position_embedding)->name, "wpe.weight");

  // The adapters carry the slot of the matrix they adapt.
  LoraOptions lora;
  lora.enabled = true;
  lora.rank = 2;
  for (const ParamSpec& p : lora_param_table(cfg, {}, lora)) {
    const bool is_a = p.name.ends_with(".lora_A");
    EXPECT_EQ(p.role, is_a ? ParamRole::lora_a : ParamRole::lora_b) << p.name;
    EXPECT_EQ(p.init, is_a ? InitKind::kaiming_uniform : InitKind::zeros) << p.name;
    const std::string base = p.name.substr(0, p.name.size() - 7);
    const std::string key = base.substr(base.find('.', 2) + 1);
    ASSERT_TRUE(block.count(key)) << p.name;
    EXPECT_EQ(p.slot, block.at(key).slot) << p.name;
  }
}

// Each InitKind gives the statistics GPT-2 prescribes.
TEST(GPTTable, InitialValuesFollowTheirKind) {
  GPTConfig cfg = small_config(50);  // Vp = 64: 14 padded rows
  cfg.n_layer = 8;
  const uint64_t seed = 7;
  for (const ParamSpec& p : gpt_param_table(cfg)) {
    std::vector<float> x(p.full_shape.numel());
    init_tensor(cfg, p, seed, x.data());
    size_t n = x.size();
    if (p.role == ParamRole::token_embedding) {
      n = static_cast<size_t>(cfg.vocab_size) * cfg.n_embd;
      for (size_t i = n; i < x.size(); ++i) ASSERT_EQ(x[i], 0.0f) << "padded row of " << p.name;
    }
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; ++i) {
      sum += x[i];
      sq += double(x[i]) * x[i];
    }
    const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    if (p.shape.ndim == 1) {
      const float v = p.name.ends_with(".weight") ? 1.0f : 0.0f;  // LayerNorm gains are 1
      for (float e : x) ASSERT_EQ(e, v) << p.name;
      continue;
    }
    const bool residual = p.name.ends_with("c_proj.weight");
    const double want = residual ? 0.02 / std::sqrt(2.0 * cfg.n_layer) : 0.02;
    EXPECT_NEAR(sd, want, 0.1 * want) << p.name;
    EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(double(n))) << p.name;
  }
}

// Skipping k draws lands where k draws land.
TEST(Rng, SkipIsThatManyDraws) {
  for (uint64_t k : {0ull, 1ull, 2ull, 12345ull}) {
    Rng walked(99), skipped(99);
    for (uint64_t i = 0; i < k; ++i) walked.next_u64();
    skipped.skip(k);
    EXPECT_EQ(walked.next_u64(), skipped.next_u64()) << k;
  }
}

// init_tensor fills a tensor in parallel blocks: each value is the one a
// single walk along the tensor's stream gives (normal: two draws per element,
// padded vocabulary rows zero and drawing nothing; kaiming: one draw each),
// for tensors of several blocks with a partial last one.
TEST(GPTTable, InitialValuesAreOneStreamPerTensor) {
  GPTConfig cfg = small_config(1000);  // Vp = 1024: 24 padded rows
  cfg.n_embd = 192;
  const uint64_t seed = 11;
  int checked = 0;
  for (const ParamSpec& p : gpt_param_table(cfg)) {
    const size_t n = static_cast<size_t>(p.full_shape.numel());
    if (n <= (size_t(1) << 16)) continue;
    std::vector<float> x(n);
    init_tensor(cfg, p, seed, x.data());
    const bool vocab = p.role == ParamRole::token_embedding;
    const size_t real = vocab ? size_t(cfg.vocab_size) * cfg.n_embd : n;
    const double sd = p.init == InitKind::normal_residual ? 0.02 / std::sqrt(2.0 * cfg.n_layer) : 0.02;
    Rng rng(Rng::mix_seed(seed, static_cast<uint64_t>(p.index)));
    for (size_t j = 0; j < n; ++j)
      ASSERT_EQ(x[j], j < real ? static_cast<float>(sd * rng.normal()) : 0.0f) << p.name << " " << j;
    ++checked;
  }
  EXPECT_GE(checked, 3);  // wte and the MLP's two matrices
  ParamSpec a;
  a.name = "lora_A";
  a.full_shape = a.shape = Shape{3, 70001};
  a.index = 5;
  a.init = InitKind::kaiming_uniform;
  std::vector<float> x(a.numel());
  init_tensor(cfg, a, seed, x.data());
  Rng rng(Rng::mix_seed(seed ^ kLoraSeedSalt, 5));
  const double bound = 1.0 / std::sqrt(70001.0);
  for (size_t j = 0; j < x.size(); ++j)
    ASSERT_EQ(x[j], static_cast<float>(bound * (2.0 * rng.uniform() - 1.0))) << j;
}

TEST(GPT, VocabularyPaddedTo64) {
  GPTConfig c = small_config(250);
  EXPECT_EQ(c.padded_vocab_size(), 256);
  c.vocab_size = 256;
  EXPECT_EQ(c.padded_vocab_size(), 256);
  c.vocab_size = 257;
  EXPECT_EQ(c.padded_vocab_size(), 320);
}

TEST(GPT, InitialLossIsLogV) {
  // With std 0.02 weights the logits are nearly uniform: loss ~ ln V.
  GPT m(small_config(64));
  m.init_weights(1);
  const int B = 2, T = 16;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  random_batch(tok, tgt, 64, 5);
  const float loss = m.forward(tok.data(), tgt.data(), B, T);
  EXPECT_NEAR(loss, std::log(64.0), 0.05);
}

TEST(GPT, SameSeedSameBitsDifferentSeedDifferent) {
  auto run = [](uint64_t seed) {
    GPT m(small_config());
    m.init_weights(seed);
    AdamW opt(m.table(), {});
    std::vector<int32_t> tok(4 * 16), tgt(4 * 16);
    std::vector<float> losses;
    for (int s = 0; s < 3; ++s) {
      random_batch(tok, tgt, 64, 100 + s);
      m.zero_grads();
      losses.push_back(m.forward(tok.data(), tgt.data(), 4, 16));
      m.backward();
      opt.step(m.params(), m.grads(), 1e-3f);
    }
    return std::make_pair(losses, std::vector<float>(m.params(), m.params() + m.num_params()));
  };
  const auto a = run(7), b = run(7), c = run(8);
  EXPECT_EQ(0, std::memcmp(a.first.data(), b.first.data(), a.first.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.second.data(), b.second.data(), a.second.size() * sizeof(float)));
  EXPECT_NE(a.first[0], c.first[0]);
}

TEST(GPT, PaddedVocabularyRowsGetNoGradient) {
  GPTConfig c = small_config(50);  // Vp = 64
  GPT m(c);
  m.init_weights(3);
  std::vector<int32_t> tok(2 * 8), tgt(2 * 8);
  random_batch(tok, tgt, 50, 9);
  m.zero_grads();
  m.forward(tok.data(), tgt.data(), 2, 8);
  m.backward();
  auto g = m.grad("wte.weight");
  auto p = m.param("wte.weight");
  double real = 0;
  for (size_t i = 0; i < 50u * 32u; ++i) real += std::fabs(g[i]);
  EXPECT_GT(real, 0.0);
  for (size_t i = 50u * 32u; i < g.size(); ++i) {
    ASSERT_EQ(g[i], 0.0f) << "padded row element " << i;
    ASSERT_EQ(p[i], 0.0f);
  }
}

namespace {
// The largest |gradient| of a, and the largest gap between a's and b's.
std::pair<double, double> grad_gap(const GPT& a, const GPT& b) {
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < a.num_params(); ++i) {
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(a.grads()[i])));
    max_err = std::max(max_err, static_cast<double>(std::fabs(a.grads()[i] - b.grads()[i])));
  }
  return {max_ref, max_err};
}

// One forward and backward (loss scale 0.7) of two models of config c with
// options oa and ob, the same weights (seed) and a random batch of (B, T)
// from seed + 1: the losses within loss_rel of each other, and every
// gradient within grad_rel of the largest (which must not be 0).
void expect_same_step(const GPTConfig& c, const GPTOptions& oa, const GPTOptions& ob,
                      uint64_t seed, int B, int T, double loss_rel, double grad_rel) {
  GPT a(c, {}, oa), b(c, {}, ob);
  a.init_weights(seed);
  b.init_weights(seed);
  std::vector<int32_t> tok(size_t(B) * T), tgt(size_t(B) * T);
  random_batch(tok, tgt, c.vocab_size, seed + 1);
  a.zero_grads();
  b.zero_grads();
  const float la = a.forward(tok.data(), tgt.data(), B, T);
  const float lb = b.forward(tok.data(), tgt.data(), B, T);
  EXPECT_NEAR(lb, la, loss_rel * la);
  a.backward(0.7f);
  b.backward(0.7f);
  const auto [max_ref, max_err] = grad_gap(a, b);
  EXPECT_GT(max_ref, 0.0);
  EXPECT_LE(max_err, grad_rel * max_ref);
}
}  // namespace

TEST(GPT, GradientAccumulationEqualsBigBatch) {
  // Two micro-batches of 2 with loss scale 1/2 == one batch of 4.
  GPT a(small_config()), b(small_config());
  a.init_weights(11);
  b.init_weights(11);
  std::vector<int32_t> tok(4 * 16), tgt(4 * 16);
  random_batch(tok, tgt, 64, 12);
  a.zero_grads();
  a.forward(tok.data(), tgt.data(), 4, 16);
  a.backward();
  b.zero_grads();
  for (int k = 0; k < 2; ++k) {
    b.forward(tok.data() + k * 32, tgt.data() + k * 32, 2, 16);
    b.backward(0.5f);
  }
  const auto [max_ref, max_err] = grad_gap(a, b);
  EXPECT_LE(max_err, 1e-5 * max_ref);
}

// The classifier computes its logits a chunk of rows at a time: 32 rows in
// chunks of 7 (the last one of 4) give the loss and gradients of one chunk
// of 32 (only wte's gradient sums its rows in another order), and hold 7
// rows of logits instead of 32.
TEST(GPT, ClassifierInChunksMatchesOneChunk) {
  const GPTConfig c = small_config(50);  // Vp 64
  GPTOptions chunked;
  chunked.classifier_rows = 7;
  expect_same_step(c, {}, chunked, 5, 2, 16, 1e-6, 1e-6);
  EXPECT_EQ(GPT::activation_bytes(c, {}, {}, 2, 16) - GPT::activation_bytes(c, {}, chunked, 2, 16),
            (32u - 7u) * 64u * sizeof(float));
}

// forward() with the loss scale runs the classifier's backward while each
// chunk's logits are at hand; backward() without it recomputes them. The
// arithmetic is the same, so the gradients are the same bits.
TEST(GPT, ClassifierBackwardInForwardGivesTheSameBits) {
  const GPTConfig c = small_config(50);
  GPTOptions o;
  o.classifier_rows = 7;
  GPT a(c, {}, o), b(c, {}, o);
  a.init_weights(7);
  b.init_weights(7);
  std::vector<int32_t> tok(2 * 16), tgt(2 * 16);
  random_batch(tok, tgt, 50, 8);
  a.zero_grads();
  b.zero_grads();
  const float la = a.forward(0, tok.data(), tgt.data(), 2, 16, 0.7f);
  const float lb = b.forward(0, tok.data(), tgt.data(), 2, 16);
  EXPECT_EQ(la, lb);
  a.backward(0, 0.7f);
  b.backward(0, 0.7f);
  EXPECT_EQ(std::memcmp(a.grads(), b.grads(), a.num_params() * sizeof(float)), 0);
  // The scale of backward() must be the one forward() used.
  a.forward(0, tok.data(), tgt.data(), 2, 16, 0.7f);
  EXPECT_THROW(a.backward(0, 0.5f), RankError);
}

// ZeRO 2's token-embedding gradient in blocks of vocabulary rows, never
// whole: the classifier's part made again a block of rows of wte at a time,
// the lookup's after the blocks. Summed back, the blocks give the gradient
// of the whole tensor (to the rounding of another summation order), with
// the classifier's backward in forward() or in backward(), the logits in
// chunks of 7 rows (so the blocks hold 7 * 64 / 32 = 14 of wte's rows, the
// last one 8) or whole.
TEST(GPT, TokenEmbeddingGradientInBlocksOfRows) {
  const GPTConfig c = small_config(50);  // Vp 64
  for (const int chunk : {7, 0}) {
    for (const bool head_in_forward : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "classifier_rows " << chunk << " head in forward "
                                        << head_in_forward);
      GPTOptions o;
      o.classifier_rows = chunk;
      GPTOptions blocks = o;
      blocks.own_grads = false;
      GPT a(c, {}, o), b(c, {}, blocks);
      a.init_weights(3);
      b.init_weights(3);
      std::vector<float> g(b.num_params(), 0.0f);
      b.set_grad_target([&](size_t i) { return g.data() + b.table()[i].offset; }, [](int) {});
      const ParamSpec& wte = b.table()[0];
      ASSERT_EQ(wte.tied, TiedGroup::embedding);
      const int rows = wte_grad_rows(c, {}, blocks, 32);
      EXPECT_EQ(rows, chunk == 7 ? 14 : 64);
      std::vector<float> bucket(size_t(rows) * c.n_embd, 0.0f);
      std::vector<int> seen;
      b.set_wte_grad_blocks(bucket.data(), rows, [&](int r0, int n) {
        seen.push_back(r0);
        for (size_t e = 0; e < size_t(n) * c.n_embd; ++e)
          g[wte.offset + size_t(r0) * c.n_embd + e] += bucket[e];
      });
      std::vector<int32_t> tok(2 * 16), tgt(2 * 16);
      random_batch(tok, tgt, 50, 4);
      a.zero_grads();
      const float la = a.forward(0, tok.data(), tgt.data(), 2, 16);
      const float lb = head_in_forward ? b.forward(0, tok.data(), tgt.data(), 2, 16, 0.7f)
                                       : b.forward(0, tok.data(), tgt.data(), 2, 16);
      EXPECT_EQ(la, lb);
      a.backward(0, 0.7f);
      b.backward(0, 0.7f);
      // Each block twice: the classifier's, then the lookup's.
      EXPECT_EQ(seen.size(), 2 * size_t((64 + rows - 1) / rows));
      double max_ref = 0, max_err = 0;
      for (size_t i = 0; i < a.num_params(); ++i) {
        max_ref = std::max(max_ref, double(std::fabs(a.grads()[i])));
        max_err = std::max(max_err, double(std::fabs(a.grads()[i] - g[i])));
      }
      EXPECT_GT(max_ref, 0.0);
      EXPECT_LE(max_err, 1e-6 * max_ref);
    }
  }
}

// train.attention = flash: the same loss and gradients as the kept
// probabilities (to fp32 rounding: the backward takes sum_s P dP as dY . Y),
// with T - 1 fewer floats per row of a head in every block and in the
// backward's scratch.
TEST(GPT, FlashAttentionMatchesTheProbabilities) {
  const GPTConfig c = small_config(50);
  GPTOptions flash;
  flash.attention = Attention::flash;
  expect_same_step(c, {}, flash, 9, 3, 16, 1e-6, 1e-5);
  const size_t rows = size_t(3) * c.n_head * 16;  // (B, NH, T)
  EXPECT_EQ(GPT::activation_bytes(c, {}, {}, 3, 16) - GPT::activation_bytes(c, {}, flash, 3, 16),
            (c.n_layer + 1) * rows * (16 - 1) * sizeof(float));
  // auto is the run configuration's to resolve.
  GPTOptions automatic;
  automatic.attention = Attention::automatic;
  EXPECT_THROW(GPT(c, {}, automatic), RankError);
}

// runtime.op_timings: the timed backend passes every call on as is (the
// same bits) and counts each op it timed.
TEST(GPT, TimedKernelsChangeNoBitAndCountEveryOp) {
  const GPTConfig c = small_config(50);
  const ops::TimedKernels timed(ops::Kernels::cpu());
  GPTOptions plain;
  plain.attention = Attention::flash;
  GPTOptions o = plain;
  o.kernels = &timed;
  GPT a(c, {}, plain), b(c, {}, o);
  a.init_weights(3);
  b.init_weights(3);
  std::vector<int32_t> tok(2 * 16), tgt(2 * 16);
  random_batch(tok, tgt, 50, 4);
  a.zero_grads();
  b.zero_grads();
  EXPECT_EQ(a.forward(tok.data(), tgt.data(), 2, 16), b.forward(tok.data(), tgt.data(), 2, 16));
  a.backward(0.5f);
  b.backward(0.5f);
  EXPECT_EQ(std::memcmp(a.grads(), b.grads(), a.num_params() * sizeof(float)), 0);
  using ops::KernelOp;
  EXPECT_EQ(timed.calls(KernelOp::flash_attention_forward), size_t(c.n_layer));
  EXPECT_EQ(timed.calls(KernelOp::flash_attention_backward), size_t(c.n_layer));
  EXPECT_EQ(timed.calls(KernelOp::attention_forward), 0u);
  // Per block ln_1, and ln_f; ln_2 with the residual add before it.
  EXPECT_EQ(timed.calls(KernelOp::layernorm_forward), size_t(c.n_layer + 1));
  EXPECT_EQ(timed.calls(KernelOp::residual_layernorm_forward), size_t(c.n_layer));
  EXPECT_EQ(timed.calls(KernelOp::residual_forward), size_t(c.n_layer));
  EXPECT_EQ(timed.calls(KernelOp::gelu_backward), size_t(c.n_layer));
  EXPECT_GT(timed.seconds(KernelOp::matmul_backward), 0.0);
  EXPECT_STREQ(ops::kernel_op_name(KernelOp::scale), "scale");
}

TEST(GPT, ActivationMemoryIsTrackedAndPredicted) {
  const GPTConfig c = small_config();
  const size_t before = MemTracker::get().current(MemCategory::activations);
  {
    GPT m(c);
    m.init_weights(1);
    std::vector<int32_t> tok(3 * 10, 1), tgt(3 * 10, 2);
    m.forward(tok.data(), tgt.data(), 3, 10);
    EXPECT_EQ(MemTracker::get().current(MemCategory::activations) - before,
              GPT::activation_bytes(c, 3, 10));
    EXPECT_GE(MemTracker::get().current(MemCategory::params), m.num_params() * sizeof(float));
  }
  EXPECT_EQ(MemTracker::get().current(MemCategory::activations), before);
}

// activation_bytes (a count alone, kept for the next call) equals what the
// layout a model allocates cuts, over every option that changes the cuts:
// slots in flight, checkpointing, attention, LoRA, the stage's ends and tp,
// for GPT-2 and Llama; each asked twice.
TEST(GPT, ActivationBytesCountWhatTheLayoutCuts) {
  GPTConfig llama{.n_layer = 3, .n_head = 4, .n_embd = 32, .vocab_size = 64, .max_seq_len = 16};
  llama.arch = ModelArch::llama;
  llama.n_kv_head = 1;
  llama.intermediate_size = 48;
  GPTConfig gpt2 = small_config();
  gpt2.n_layer = 3;
  gpt2.n_head = 4;
  int cases = 0;
  for (int round = 0; round < 2; ++round)
    for (const GPTConfig& c : {gpt2, llama})
      for (int slots : {1, 3})
        for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
          for (Attention att : {Attention::probabilities, Attention::flash})
            for (bool lora : {false, true})
              for (int stage = 0; stage < 3; ++stage)
                for (int tp : {1, 2}) {
                  GPTOptions o;
                  o.slots = slots;
                  o.micro_batches = 2 * slots;
                  o.checkpointing = ck;
                  o.attention = att;
                  o.lora.enabled = lora;
                  o.lora.targets = LinearSlots::of(c.arch);
                  ModelShard shard{.tp_size = tp};
                  if (stage == 0) shard.layer_end = 1, shard.last_stage = false;
                  if (stage == 1) shard.layer_begin = 1, shard.first_stage = false;
                  ActLayout L;
                  plan_activations(c, shard, o, 2, 8, L);
                  size_t cut = 0;
                  for (const ActLayout::Cut& k : L.cuts) cut += k.n;
                  ASSERT_EQ(cut, L.act_floats + L.grad_floats);
                  EXPECT_EQ(GPT::activation_bytes(c, shard, o, 2, 8), cut * sizeof(float))
                      << name_of(c.arch) << " slots " << slots << " ckpt " << int(ck) << " flash "
                      << int(att == Attention::flash) << " lora " << lora << " stage " << stage
                      << " tp " << tp;
                  ++cases;
                }
  EXPECT_EQ(cases, 2 * 2 * 2 * 2 * 2 * 2 * 3 * 2);
}

TEST(GPT, OverfitsOneBatch) {
  GPT m(small_config(64));
  m.init_weights(1337);
  AdamW opt(m.table(), {0.9f, 0.95f, 1e-8f, 0.0f});
  const int B = 4, T = 16;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  random_batch(tok, tgt, 64, 77);
  float loss = 0, first = 0;
  for (int step = 0; step < 300; ++step) {
    m.zero_grads();
    loss = m.forward(tok.data(), tgt.data(), B, T);
    if (step == 0) first = loss;
    m.backward();
    clip_grad_norm(m.grads(), m.num_params(), 1.0);
    opt.step(m.params(), m.grads(), 1e-2f);
    if (loss < 0.05f) break;
  }
  EXPECT_GT(first, 3.5f);
  EXPECT_LT(loss, 0.1f);
}

TEST(GPT, RejectsTokenOutsideVocabulary) {
  GPT m(small_config(64));
  std::vector<int32_t> tok(16, 1), tgt(16, 1);
  tok[5] = 64;
  EXPECT_THROW(m.forward(tok.data(), tgt.data(), 1, 16), RankError);
}

// ---- shards: pipeline stages and tensor-parallel parts ----------------------

TEST(GPTShard, TensorParallelPartsTileTheLogicalTensor) {
  // c_attn's rows are q, k, v; each is split by heads, so rank t's part is
  // rows [t*C/tp, (t+1)*C/tp) of q, then of k, then of v.
  const GPTConfig c = small_config();
  const int tp = 2, C = c.n_embd;
  for (const ParamSpec& whole : gpt_param_table(c)) {
    const size_t n = whole.numel();
    std::vector<float> full(n), back(n, -1.0f);
    for (size_t i = 0; i < n; ++i) full[i] = static_cast<float>(i);
    size_t covered = 0;
    for (int t = 0; t < tp; ++t) {
      const auto part_table = gpt_param_table(c, {.tp_rank = t, .tp_size = tp});
      const ParamSpec* p = nullptr;
      for (const auto& q : part_table)
        if (q.name == whole.name) p = &q;
      ASSERT_NE(p, nullptr) << whole.name;
      EXPECT_EQ(p->full_shape, whole.shape);
      EXPECT_EQ(p->index, whole.index);
      std::vector<float> part(p->numel());
      shard_from_full(*p, full.data(), part.data(), t, tp);
      shard_to_full(*p, part.data(), back.data(), t, tp);
      covered += part.size();
      if (whole.name == "h.0.attn.c_attn.weight") {
        // First element of rank t's k rows: row C + t*C/2 of the whole.
        const size_t k_row = static_cast<size_t>(C) / tp;  // rows of q in the part
        EXPECT_EQ(part[k_row * C], full[(C + t * C / tp) * C]);
      }
    }
    EXPECT_EQ(covered, whole.tp_dim >= 0 ? n : tp * n) << whole.name;
    EXPECT_EQ(back, full) << whole.name << ": the parts do not tile the tensor";
  }
}

// Where element (row, col) of a logical tensor sits in tensor-parallel rank
// `t`'s part, or -1 when it is not there: the split dimension's index
// d = p * per_part + t * piece + k goes to p * piece + k of the part.
static int64_t part_index(const ParamSpec& s, int64_t row, int64_t col, int t, int tp) {
  const int64_t cols = s.full_shape.ndim > 1 ? s.full_shape[1] : 1;
  if (s.tp_dim < 0) return row * cols + col;
  const int64_t D = s.full_shape[s.tp_dim], per_part = D / s.tp_parts, piece = per_part / tp;
  const int64_t d = s.tp_dim == 0 ? row : col, p = d / per_part, in = d % per_part;
  if (in / piece != t) return -1;
  const int64_t local = p * piece + in % piece;
  return s.tp_dim == 0 ? local * cols + col : row * (cols / tp) + local;
}

TEST(GPTShard, BlocksOfRowsGiveEachRankItsPart) {
  // for_each_part_run over blocks of any number of rows puts every element
  // of a rank's part where the element-by-element reference says, and
  // nothing else.
  GPTConfig c = small_config();
  c.n_head = 4;
  for (int tp : {1, 2, 4}) {
    for (int t = 0; t < tp; ++t) {
      for (const ParamSpec& p : gpt_param_table(c, {.tp_rank = t, .tp_size = tp})) {
        const int64_t rows = p.full_shape[0], cols = p.full_shape.ndim > 1 ? p.full_shape[1] : 1;
        std::vector<float> want(p.numel(), -1.0f);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < cols; ++k)
            if (const int64_t i = part_index(p, r, k, t, tp); i >= 0)
              want[static_cast<size_t>(i)] = static_cast<float>(r * cols + k);
        for (int64_t step : {int64_t{1}, int64_t{3}, int64_t{7}, rows}) {
          std::vector<float> got(p.numel(), -1.0f), block;
          for (int64_t r0 = 0; r0 < rows; r0 += step) {
            const int64_t nr = std::min(step, rows - r0);
            block.resize(static_cast<size_t>(nr * cols));
            for (size_t i = 0; i < block.size(); ++i)
              block[i] = static_cast<float>(r0 * cols + static_cast<int64_t>(i));
            for_each_part_run(p, r0, nr, t, tp, [&](size_t from, size_t to, size_t n) {
              ASSERT_LE(from + n, block.size());
              ASSERT_LE(to + n, got.size());
              std::copy_n(block.begin() + from, n, got.begin() + to);
            });
          }
          ASSERT_EQ(got, want) << p.name << " tp " << tp << " rank " << t << " rows/step " << step;
        }
      }
    }
  }
}

TEST(GPTShard, RowsPerBlockFitTheLimitInWholeQuantizationBlocks) {
  ParamSpec m;
  m.full_shape = {1000, 96};
  EXPECT_EQ(rows_per_block(m, 1 << 20), 1000);    // the whole tensor fits
  EXPECT_EQ(rows_per_block(m, 96 * 10 + 5), 10);  // 10 rows fit
  EXPECT_EQ(rows_per_block(m, 50), 1);            // a row longer than the limit: one row
  EXPECT_EQ(rows_per_block(m, 96 * 9, 64), 8);    // whole blocks of 64 come in pairs of rows: 9 -> 8
  EXPECT_EQ(rows_per_block(m, 96, 64), 2);        // never below the rows of one whole block
  ParamSpec v;
  v.full_shape = {200};
  EXPECT_EQ(row_floats(v), 1u);
  EXPECT_EQ(rows_per_block(v, 100, 64), 64);
  EXPECT_EQ(rows_per_block(v, 1000, 64), 200);
}

TEST(GPTShard, InitialValuesOfAnyRowsAreThoseOfTheWholeTensor) {
  const GPTConfig c = small_config(64);
  for (const ParamSpec& p : gpt_param_table(c)) {
    std::vector<float> whole(static_cast<size_t>(p.full_shape.numel()));
    init_tensor(c, p, 99, whole.data());
    const int64_t rows = p.full_shape[0];
    const size_t rf = row_floats(p);
    for (auto [r0, nr] : std::vector<std::pair<int64_t, int64_t>>{
             {0, rows}, {0, 1}, {rows - 1, 1}, {rows / 3, rows / 2}, {5, 0}}) {
      std::vector<float> got(static_cast<size_t>(nr) * rf + 1, -3.0f);
      init_tensor_rows(c, p, 99, r0, nr, got.data());
      ASSERT_TRUE(std::equal(got.begin(), got.end() - 1, whole.begin() + r0 * rf))
          << p.name << " rows [" << r0 << ", " << r0 + nr << ")";
      ASSERT_EQ(got.back(), -3.0f) << "wrote past the rows";
    }
  }
}

TEST(GPTShard, StageTablesHoldTheirLayersAndTheTiedEmbedding) {
  GPTConfig c = small_config();
  c.n_layer = 3;
  auto names = [&](const ModelShard& s) {
    std::vector<std::string> v;
    for (const auto& p : gpt_param_table(c, s)) v.push_back(p.name);
    return v;
  };
  const auto mid = names({.layer_begin = 1, .layer_end = 2, .first_stage = false, .last_stage = false});
  ASSERT_EQ(mid.size(), 12u);
  EXPECT_EQ(mid.front(), "h.1.ln_1.weight");
  const auto last = names({.layer_begin = 2, .layer_end = 3, .first_stage = false, .last_stage = true});
  EXPECT_EQ(last.front(), "wte.weight");  // the tied lm_head, first in the table
  EXPECT_EQ(last.back(), "ln_f.bias");
  const auto first = names({.layer_begin = 0, .layer_end = 1, .first_stage = true, .last_stage = false});
  EXPECT_EQ(first[1], "wpe.weight");
  EXPECT_EQ(first.back(), "h.0.mlp.c_proj.bias");
}

// Three stages of a 3-layer model run one after the other on one rank,
// passing activations forward and their gradients back by hand, give the
// whole model's loss and gradients: the pipeline's arithmetic, without MPI.
// (The middle stage, which holds neither embedding nor head, is the case a
// wrong first-block index breaks.)
TEST(GPTShard, ChainedStagesEqualTheWholeModel) {
  GPTConfig c = small_config();
  c.n_layer = 3;
  const int B = 2, T = 8, V = c.vocab_size;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  random_batch(tok, tgt, V, 11);
  GPT whole(c);
  whole.init_weights(5);
  whole.zero_grads();
  const float loss = whole.forward(tok.data(), tgt.data(), B, T);
  whole.backward();

  std::vector<GPT> stages;
  stages.reserve(3);
  for (int s = 0; s < 3; ++s) {
    stages.emplace_back(c, ModelShard{.layer_begin = s, .layer_end = s + 1, .first_stage = s == 0,
                                      .last_stage = s == 2});
    stages.back().init_weights(5);
    stages.back().zero_grads();
    stages.back().ensure_activations(B, T);
  }
  const size_t act = static_cast<size_t>(B) * T * c.n_embd;
  float staged = 0;
  for (int s = 0; s < 3; ++s) {
    if (s > 0) std::memcpy(stages[s].stage_input(0), stages[s - 1].stage_output(0), act * 4);
    staged = stages[s].forward(0, tok.data(), tgt.data(), B, T);
  }
  EXPECT_EQ(staged, loss);
  for (int s = 2; s >= 0; --s) {
    if (s < 2) std::memcpy(stages[s].grad_stream(), stages[s + 1].grad_stream(), act * 4);
    stages[s].backward(0, 1.0f);
  }
  for (int s = 0; s < 3; ++s) {
    for (const ParamSpec& p : stages[s].table()) {
      const auto mine = stages[s].grad(p.name);
      const auto ref = whole.grad(p.name);
      if (p.name == "wte.weight") continue;  // split between stages 0 and 2, below
      EXPECT_TRUE(std::equal(mine.begin(), mine.end(), ref.begin())) << p.name;
    }
  }
  // The tied embedding: the two stages' gradients sum to the whole model's.
  const auto g0 = stages[0].grad("wte.weight"), g2 = stages[2].grad("wte.weight");
  const auto ref = whole.grad("wte.weight");
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(g0[i]) + g2[i] - ref[i]));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  EXPECT_GT(scale, 0.0);
  EXPECT_LE(worst, 1e-6 * scale);
}
