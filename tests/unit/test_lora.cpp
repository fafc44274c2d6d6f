// LoRA adapters on a frozen base, on one rank.
//
// The independent reference is full training, whose gradients are checked
// against PyTorch (tests/torch/check_gpt2_grads.py): a model with adapters
// computes the same function as the full model with W_eff = W + s B A, so
//   loss(LoRA) = loss(full, W_eff),
//   dL/dB = s G A^T  and  dL/dA = s B^T G,   G = dL/dW_eff of the full model.
// With an f32 base the two are the same arithmetic up to rounding; with an
// NF4 or int8 base W is the dequantized matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "model/lora.h"
#include "plan/memory.h"
#include "load/base_loader.h"
#include "train/adamw.h"

using namespace meshlm;

namespace {

const LinearSlots kQkvAndMlpDown = [] {
  LinearSlots s;
  s.add(LinearSlot::qkv);
  s.add(LinearSlot::mlp_down);
  return s;
}();

GPTConfig small_config() {
  return {.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 64, .max_seq_len = 16};
}

constexpr uint64_t kBaseSeed = 11, kLoraSeed = 12;
// Relative tolerances (float32 against float32 arithmetic in another order).
constexpr double kLossTol = 1e-5;
constexpr double kGradTol = 2e-4;

double rel_err(const float* a, const float* b, size_t n) {
  double d = 0, s = 0;
  for (size_t i = 0; i < n; ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    s += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / std::max(s, 1e-30));
}

// A quantized base in a private store, as one rank would hold it.
struct Base {
  load::StoreManifest m;
  Buffer store;
  Base(const GPTConfig& cfg, quant::QuantType type) : m(load::make_manifest(cfg, type)) {
    store = Buffer(m.bytes, MemCategory::quantized, "test.store");
    quant::QuantConfig q;
    q.type = type;
    load::fill_store(cfg, q, kBaseSeed, m, store.as<uint8_t>(), /*use_cache=*/false);
  }
  quant::QTensor tensor(const std::string& name) const {
    const load::StoreEntry& e = m.at(name);
    return quant::qtensor_at(e.layout, store.as<uint8_t>() + e.offset);
  }
  // The logical tensor as the model sees it (dequantized).
  std::vector<float> dequantized(const std::string& name) const {
    const quant::QTensor q = tensor(name);
    std::vector<float> out(q.n);
    quant::dequantize_ref(q, 0, q.n, out.data());
    return out;
  }
};

GPTOptions lora_options(int rank, float alpha, LinearSlots targets) {
  GPTOptions o;
  o.lora.enabled = true;
  o.lora.rank = rank;
  o.lora.alpha = alpha;
  o.lora.targets = targets;
  return o;
}

void random_batch(std::vector<int32_t>& tok, std::vector<int32_t>& tgt, int V, uint64_t seed) {
  Rng r(seed);
  for (auto& t : tok) t = static_cast<int32_t>(r.below(V));
  for (auto& t : tgt) t = static_cast<int32_t>(r.below(V));
}

// LoRA model vs the full model with W_eff = W + s B A, for one base format;
// with `gpu_tiles`, the quantized layers as a GPU runs them (every matrix in
// one tile, the classifier dequantized whole once per pass).
void check_against_full(quant::QuantType type, LinearSlots targets, bool gpu_tiles = false) {
  const GPTConfig cfg = small_config();
  const Base base(cfg, type);
  const int r = 4;
  const float alpha = 8.0f, s = alpha / r;
  GPTOptions opts = lora_options(r, alpha, targets);
  if (gpu_tiles) {
    opts.qtile_rows = 8192;
    opts.whole_classifier_tile = true;
  }
  GPT lora(cfg, {}, opts);
  lora.attach_base([&](const ParamSpec& p) { return base.tensor(p.name); });
  lora.init_weights(kLoraSeed);
  // B starts at zero; give it values so that dA is not zero too.
  Rng rng(99);
  for (const ParamSpec& p : lora.table())
    if (p.name.ends_with(".lora_B"))
      for (float& x : lora.param(p.name)) x = static_cast<float>(0.05 * rng.normal());

  GPT full(cfg);
  for (const ParamSpec& p : full.table()) {
    const std::vector<float> w = base.dequantized(p.name);
    std::memcpy(full.param(p.name).data(), w.data(), w.size() * sizeof(float));
  }
  // W_eff = W + s B A for every adapted matrix.
  for (const ParamSpec& pa : lora.table()) {
    if (!pa.name.ends_with(".lora_A")) continue;
    const std::string wname = pa.name.substr(0, pa.name.size() - 7);
    const ParamSpec& pb = lora.spec(wname + ".lora_B");
    const auto A = lora.param(pa.name), Bm = lora.param(pb.name);
    auto W = full.param(wname);
    const int64_t OC = pb.shape.dims[0], IC = pa.shape.dims[1];
    for (int64_t o = 0; o < OC; ++o)
      for (int64_t i = 0; i < IC; ++i) {
        double acc = 0;
        for (int k = 0; k < r; ++k) acc += static_cast<double>(Bm[o * r + k]) * A[k * IC + i];
        W[o * IC + i] += static_cast<float>(s * acc);
      }
  }

  const int B = 2, T = 8;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  random_batch(tok, tgt, cfg.vocab_size, 5);
  lora.zero_grads();
  full.zero_grads();
  const float l_lora = lora.forward(tok.data(), tgt.data(), B, T);
  const float l_full = full.forward(tok.data(), tgt.data(), B, T);
  EXPECT_NEAR(l_lora, l_full, kLossTol * std::abs(l_full));
  lora.backward();
  full.backward();

  int checked = 0;
  for (const ParamSpec& pa : lora.table()) {
    if (!pa.name.ends_with(".lora_A")) continue;
    const std::string wname = pa.name.substr(0, pa.name.size() - 7);
    const ParamSpec& pb = lora.spec(wname + ".lora_B");
    const auto A = lora.param(pa.name), Bm = lora.param(pb.name);
    const auto G = full.grad(wname);
    const int64_t OC = pb.shape.dims[0], IC = pa.shape.dims[1];
    std::vector<float> dA(r * IC), dB(OC * r);
    for (int k = 0; k < r; ++k)
      for (int64_t i = 0; i < IC; ++i) {
        double acc = 0;
        for (int64_t o = 0; o < OC; ++o) acc += static_cast<double>(Bm[o * r + k]) * G[o * IC + i];
        dA[k * IC + i] = static_cast<float>(s * acc);
      }
    for (int64_t o = 0; o < OC; ++o)
      for (int k = 0; k < r; ++k) {
        double acc = 0;
        for (int64_t i = 0; i < IC; ++i) acc += static_cast<double>(G[o * IC + i]) * A[k * IC + i];
        dB[o * r + k] = static_cast<float>(s * acc);
      }
    SCOPED_TRACE(wname);
    EXPECT_LE(rel_err(lora.grad(pa.name).data(), dA.data(), dA.size()), kGradTol);
    EXPECT_LE(rel_err(lora.grad(pb.name).data(), dB.data(), dB.size()), kGradTol);
    ++checked;
  }
  EXPECT_EQ(checked, cfg.n_layer * std::popcount(targets.bits));
}

}  // namespace

TEST(LoraTable, DerivedFromTheBaseTable) {
  const GPTConfig cfg = small_config();
  LoraOptions o;
  o.enabled = true;
  o.rank = 4;
  const auto t = lora_param_table(cfg, {}, o);
  ASSERT_EQ(t.size(), 2u * 4u * cfg.n_layer);
  EXPECT_EQ(t[0].name, "h.0.attn.c_attn.weight.lora_A");
  EXPECT_EQ(t[0].shape, (Shape{4, 32}));
  EXPECT_EQ(t[1].name, "h.0.attn.c_attn.weight.lora_B");
  EXPECT_EQ(t[1].shape, (Shape{96, 4}));
  EXPECT_EQ(t[1].tp_parts, 3);  // q, k, v each split, like c_attn
  size_t offset = 0;
  for (const auto& p : t) {
    EXPECT_EQ(p.offset, offset) << p.name;
    offset += p.numel();
    EXPECT_GE(p.layer, 0);
    EXPECT_TRUE(p.decay());
  }
  // Tensor parallelism: column-parallel layers split B by rows (A
  // replicated); row-parallel ones split A by columns (B replicated).
  ModelShard sh;
  sh.tp_size = 2;
  sh.tp_rank = 1;
  sh.layer_begin = 1;
  sh.layer_end = 2;
  const auto t2 = lora_param_table(cfg, sh, o);
  ASSERT_EQ(t2.size(), 8u);
  for (const auto& p : t2) {
    EXPECT_EQ(p.layer, 1);
    const bool column = p.name.find("c_attn") != std::string::npos ||
                        p.name.find("c_fc") != std::string::npos;
    if (p.name.ends_with("lora_A")) EXPECT_EQ(p.tp_dim, column ? -1 : 1) << p.name;
    if (p.name.ends_with("lora_B")) EXPECT_EQ(p.tp_dim, column ? 0 : -1) << p.name;
  }
  EXPECT_EQ(t2[6].name, "h.1.mlp.c_proj.weight.lora_A");
  EXPECT_EQ(t2[6].shape, (Shape{4, 64}));  // (r, 4C / tp)
  // Only some targets.
  o.targets = kQkvAndMlpDown;
  EXPECT_EQ(lora_param_table(cfg, {}, o).size(), 2u * 2u * cfg.n_layer);
}

TEST(LoraTable, TargetsParse) {
  LinearSlots t;
  std::string bad;
  ASSERT_TRUE(parse_slots("qkv", t, bad));
  EXPECT_EQ(t.bits, 1u);
  ASSERT_TRUE(parse_slots("mlp-down, qkv", t, bad));
  EXPECT_EQ(t, kQkvAndMlpDown);
  ASSERT_TRUE(parse_slots("qkv,attn-out,mlp-up,mlp-down", t, bad));
  EXPECT_EQ(t, LinearSlots::of(ModelArch::gpt2));
  LinearSlots au;
  au.add(LinearSlot::attn_out);
  au.add(LinearSlot::mlp_up);
  EXPECT_EQ(slots_text(au), "attn-out,mlp-up");
  EXPECT_FALSE(parse_slots("qkv,ffn", t, bad));
  EXPECT_EQ(bad, "ffn");
  ASSERT_TRUE(parse_slots("", t, bad));
  EXPECT_TRUE(t.empty());
  FinetuneConfig f;
  f.lora_targets = {};
  EXPECT_THROW(f.validate(), CollectiveError);
}

TEST(Lora, StartsAsTheBaseModel) {
  // B = 0 at initialisation: the adapted model's loss is the base model's.
  const GPTConfig cfg = small_config();
  const Base base(cfg, quant::QuantType::f32);
  GPT lora(cfg, {}, lora_options(4, 8.0f, LinearSlots::of(ModelArch::gpt2)));
  lora.attach_base([&](const ParamSpec& p) { return base.tensor(p.name); });
  lora.init_weights(kLoraSeed);
  GPT full(cfg);
  full.init_weights(kBaseSeed);  // the f32 base is GPT-2's initialisation from kBaseSeed
  std::vector<int32_t> tok(16), tgt(16);
  random_batch(tok, tgt, cfg.vocab_size, 3);
  EXPECT_EQ(lora.forward(tok.data(), tgt.data(), 2, 8), full.forward(tok.data(), tgt.data(), 2, 8));
}

TEST(Lora, GradientsEqualTheFullModelsOnAnF32Base) {
  check_against_full(quant::QuantType::f32, LinearSlots::of(ModelArch::gpt2));
}

TEST(Lora, GradientsOnAQuantizedBase) {
  check_against_full(quant::QuantType::nf4, LinearSlots::of(ModelArch::gpt2));
  check_against_full(quant::QuantType::int8, kQkvAndMlpDown);
}

TEST(Lora, GradientsOnAQuantizedBaseInAGpusTiles) {
  check_against_full(quant::QuantType::nf4, LinearSlots::of(ModelArch::gpt2), /*gpu_tiles=*/true);
  check_against_full(quant::QuantType::int8, kQkvAndMlpDown, /*gpu_tiles=*/true);
}

TEST(Lora, TheBaseHasNoGradientsAndNoOptimizerState) {
  const GPTConfig cfg = small_config();
  RankPlan full_shape, lora_shape;
  lora_shape.model = lora_options(4, 8.0f, LinearSlots::of(ModelArch::gpt2));
  const MemoryByCategory f = predict_memory(cfg, full_shape, 0, false);
  const MemoryByCategory l = predict_memory(cfg, lora_shape, 0, false);
  const size_t n_lora = table_numel(lora_param_table(cfg, {}, lora_shape.model.lora));
  EXPECT_EQ(at(l, MemCategory::grads), n_lora * sizeof(float));
  EXPECT_EQ(at(l, MemCategory::optimizer), 2 * n_lora * sizeof(float));
  EXPECT_EQ(at(l, MemCategory::params),
            (n_lora + GPT::frozen_numel(cfg, {})) * sizeof(float));
  EXPECT_LT(at(l, MemCategory::grads) * 5, at(f, MemCategory::grads));
  // And the model allocates exactly that.
  const Base base(cfg, quant::QuantType::nf4);
  MemTracker::get().reset_peaks();
  const size_t params0 = MemTracker::get().current(MemCategory::params);
  const size_t grads0 = MemTracker::get().current(MemCategory::grads);
  GPT lora(cfg, {}, lora_shape.model);
  lora.attach_base([&](const ParamSpec& p) { return base.tensor(p.name); });
  EXPECT_EQ(MemTracker::get().current(MemCategory::params) - params0, at(l, MemCategory::params));
  EXPECT_EQ(MemTracker::get().current(MemCategory::grads) - grads0, at(l, MemCategory::grads));
}

TEST(Lora, TrainingMovesOnlyTheAdapters) {
  const GPTConfig cfg = small_config();
  const Base base(cfg, quant::QuantType::nf4);
  const std::vector<uint8_t> before(base.store.as<uint8_t>(), base.store.as<uint8_t>() + base.m.bytes);
  GPT lora(cfg, {}, lora_options(4, 8.0f, LinearSlots::of(ModelArch::gpt2)));
  lora.attach_base([&](const ParamSpec& p) { return base.tensor(p.name); });
  lora.init_weights(kLoraSeed);
  std::vector<int32_t> tok(16), tgt(16);
  random_batch(tok, tgt, cfg.vocab_size, 4);
  float first = 0, last = 0;
  AdamW opt(lora.table(), AdamWConfig{0.9f, 0.95f, 1e-8f, 0.0f}, 0, lora.num_params());
  for (int step = 0; step < 30; ++step) {
    lora.zero_grads();
    const float loss = lora.forward(tok.data(), tgt.data(), 2, 8);
    lora.backward();
    opt.step(lora.params(), lora.grads(), 1e-2f);
    if (step == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, first - 0.5f);
  EXPECT_EQ(std::memcmp(before.data(), base.store.as<uint8_t>(), before.size()), 0)
      << "the frozen base changed";
}
