#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "comm/comm.h"
#include "ops/ops.h"

namespace meshlm {

// gpt_param_table() lists each block's tensors in a fixed order, 12 of them.
constexpr size_t kTensorsPerBlock = 12;

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

std::vector<ParamSpec> gpt_param_table(const GPTConfig& cfg, const ModelShard& shard) {
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab_size(), maxT = cfg.max_seq_len;
  const int tp = shard.tp_size;
  const int lb = shard.layer_begin, le = shard.layer_end < 0 ? cfg.n_layer : shard.layer_end;
  MESHLM_CHECK(tp >= 1 && shard.tp_rank >= 0 && shard.tp_rank < tp, "bad tensor-parallel rank");
  MESHLM_CHECK(0 <= lb && lb <= le && le <= cfg.n_layer, "bad layer range");
  TableBuilder b(tp);
  // Vocabulary-parallel embedding: TP splits the rows of wte (and so the
  // logits of the tied lm_head). Column-parallel layers (c_attn, c_fc) split
  // their output rows (dim 0; c_attn's rows are q, k, v, each split by heads);
  // row-parallel ones (c_proj) their input columns (dim 1).
  const bool first = shard.first_stage, last = shard.last_stage;
  b.add("wte.weight", {Vp, C}, 0, 1, -1, first || last);
  b.add("wpe.weight", {maxT, C}, -1, 1, -1, first);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const bool mine = lb <= l && l < le;
    b.add(h + "ln_1.weight", {C}, -1, 1, l, mine);
    b.add(h + "ln_1.bias", {C}, -1, 1, l, mine);
    b.add(h + "attn.c_attn.weight", {3 * C, C}, 0, 3, l, mine);
    b.add(h + "attn.c_attn.bias", {3 * C}, 0, 3, l, mine);
    b.add(h + "attn.c_proj.weight", {C, C}, 1, 1, l, mine);
    b.add(h + "attn.c_proj.bias", {C}, -1, 1, l, mine);
    b.add(h + "ln_2.weight", {C}, -1, 1, l, mine);
    b.add(h + "ln_2.bias", {C}, -1, 1, l, mine);
    b.add(h + "mlp.c_fc.weight", {4 * C, C}, 0, 1, l, mine);
    b.add(h + "mlp.c_fc.bias", {4 * C}, 0, 1, l, mine);
    b.add(h + "mlp.c_proj.weight", {C, 4 * C}, 1, 1, l, mine);
    b.add(h + "mlp.c_proj.bias", {C}, -1, 1, l, mine);
  }
  b.add("ln_f.weight", {C}, -1, 1, -1, last);
  b.add("ln_f.bias", {C}, -1, 1, -1, last);
  return b.take();
}

void TableBuilder::add(std::string name, Shape full, int tp_dim, int parts, int layer, bool keep) {
  const int idx = index_++;
  if (!keep) return;
  Shape local = full;
  if (tp_dim >= 0) {
    MESHLM_CHECK(full.dims[tp_dim] % (static_cast<int64_t>(parts) * tp_) == 0,
                 name + " does not split evenly over the tensor-parallel group");
    local.dims[tp_dim] /= tp_;
  }
  ParamSpec p{std::move(name), local, offset_, tp_dim, layer, full, parts, idx};
  offset_ += p.numel();
  table_.push_back(std::move(p));
}

std::vector<ParamSpec> trainable_table(const GPTConfig& cfg, const ModelShard& shard,
                                       const GPTOptions& opts) {
  return opts.lora.enabled ? lora_param_table(cfg, shard, opts.lora) : gpt_param_table(cfg, shard);
}

size_t table_numel(const std::vector<ParamSpec>& table) {
  return table.empty() ? 0 : table.back().offset + table.back().numel();
}

namespace {
// The logical tensor seen as (outer, D, inner) with D = full_shape[tp_dim]
// made of tp_parts parts; rank r holds piece r of every part of every outer
// row. Copies full -> part (to_part) or back.
void shard_copy(const ParamSpec& s, float* full, float* part, int r, int tp, bool to_part) {
  if (s.tp_dim < 0 || tp == 1) {
    if (to_part)
      std::memcpy(part, full, s.numel() * sizeof(float));
    else
      std::memcpy(full, part, s.numel() * sizeof(float));
    return;
  }
  const Shape& f = s.full_shape;
  size_t outer = 1, inner = 1;
  for (int d = 0; d < s.tp_dim; ++d) outer *= f.dims[d];
  for (int d = s.tp_dim + 1; d < f.ndim; ++d) inner *= f.dims[d];
  const size_t D = f.dims[s.tp_dim], per_part = D / s.tp_parts, piece = per_part / tp;
  for (size_t o = 0; o < outer; ++o) {
    for (int p = 0; p < s.tp_parts; ++p) {
      float* a = full + (o * D + p * per_part + r * piece) * inner;
      float* b = part + (o * (D / tp) + p * piece) * inner;
      if (to_part)
        std::memcpy(b, a, piece * inner * sizeof(float));
      else
        std::memcpy(a, b, piece * inner * sizeof(float));
    }
  }
}
}  // namespace

void shard_from_full(const ParamSpec& spec, const float* full, float* part, int tp_rank,
                     int tp_size) {
  shard_copy(spec, const_cast<float*>(full), part, tp_rank, tp_size, true);
}

void shard_to_full(const ParamSpec& spec, const float* part, float* full, int tp_rank,
                   int tp_size) {
  shard_copy(spec, full, const_cast<float*>(part), tp_rank, tp_size, false);
}

GPT::GPT(const GPTConfig& cfg, const ModelShard& shard, const GPTOptions& opts,
         comm::Communicator* tp)
    : cfg_(cfg), shard_(shard), opts_(opts), tp_(tp, nullptr) {
  cfg_.validate();
  if (shard_.layer_end < 0) shard_.layer_end = cfg_.n_layer;
  MESHLM_CHECK(shard_.tp_size == 1 || (tp != nullptr && tp->size() == shard_.tp_size),
               "tensor parallelism needs its group");
  MESHLM_CHECK(cfg_.n_head % shard_.tp_size == 0, "heads must split evenly over TP");
  MESHLM_CHECK(cfg_.padded_vocab_size() % shard_.tp_size == 0, "vocabulary must split over TP");
  MESHLM_CHECK(opts_.slots >= 1 && opts_.pad_multiple >= 1, "bad GPT options");
  base_table_ = gpt_param_table(cfg_, shard_);
  table_ = opts_.lora.enabled ? lora_param_table(cfg_, shard_, opts_.lora) : base_table_;
  n_local_ = shard_.layer_end - shard_.layer_begin;
  bool found_block = false;
  for (size_t i = 0; i < base_table_.size(); ++i) {
    const ParamSpec& p = base_table_[i];
    if (p.name == "wte.weight") idx_wte_ = static_cast<int>(i);
    if (p.name == "wpe.weight") idx_wpe_ = static_cast<int>(i);
    if (p.name == "ln_f.weight") idx_lnf_ = static_cast<int>(i);
    if (p.layer == shard_.layer_begin && !found_block) {
      first_block_ = i;
      found_block = true;
    }
  }
  lora_index_.assign(n_local_, {-1, -1, -1, -1});
  if (opts_.lora.enabled) {
    for (size_t i = 0; i < table_.size(); ++i) {
      const ParamSpec& p = table_[i];
      for (int t = 0; t < kLinearSlots; ++t)
        if (p.name == lora_base_name(p.layer, static_cast<LinearSlot>(t)) + ".lora_A")
          lora_index_[p.layer - shard_.layer_begin][t] = static_cast<int>(i);
    }
  }
  num_params_ = table_numel(table_);
  padded_params_ = (num_params_ + opts_.pad_multiple - 1) / opts_.pad_multiple * opts_.pad_multiple;
  params_ = Buffer(padded_params_ * sizeof(float), MemCategory::params,
                   opts_.lora.enabled ? "lora.params" : "gpt.params");
  if (opts_.own_grads)
    grads_ = Buffer(padded_params_ * sizeof(float), MemCategory::grads,
                    opts_.lora.enabled ? "lora.grads" : "gpt.grads");
}

size_t GPT::frozen_numel(const GPTConfig& cfg, const ModelShard& shard) {
  size_t n = 0;
  for (const ParamSpec& p : gpt_param_table(cfg, shard))
    if (p.shape.ndim == 1) n += p.numel();
  return n;
}

void GPT::attach_base(const std::function<quant::QTensor(const ParamSpec&)>& tensor_of) {
  MESHLM_CHECK(opts_.lora.enabled, "attach_base() is for LoRA fine-tuning (a frozen base)");
  qbase_.assign(base_table_.size(), quant::QSlice{});
  frozen_offset_.assign(base_table_.size(), SIZE_MAX);
  size_t n = 0;
  for (size_t i = 0; i < base_table_.size(); ++i)
    if (base_table_[i].shape.ndim == 1) {
      frozen_offset_[i] = n;
      n += base_table_[i].numel();
    }
  frozen_ = Buffer(n * sizeof(float), MemCategory::params, "lora.frozen_vectors");
  std::vector<float> whole;
  for (size_t i = 0; i < base_table_.size(); ++i) {
    const ParamSpec& p = base_table_[i];
    const quant::QTensor q = tensor_of(p);
    MESHLM_CHECK(q.n == static_cast<size_t>(p.full_shape.numel()),
                 "the frozen base's " + p.name + " has the wrong size");
    if (p.shape.ndim == 1) {
      whole.resize(q.n);
      quant::dequantize_ref(q, 0, q.n, whole.data());
      shard_from_full(p, whole.data(), frozen_.as<float>() + frozen_offset_[i], shard_.tp_rank,
                      shard_.tp_size);
    } else {
      qbase_[i] = quant::make_qslice(q, p.full_shape.dims[0], p.full_shape.dims[1], p.tp_dim,
                                     p.tp_parts, shard_.tp_rank, shard_.tp_size);
    }
  }
}

const quant::QSlice* GPT::qbase(size_t i) const {
  // Vectors (and every tensor in full training) have no slice: R == 0.
  return i < qbase_.size() && qbase_[i].R > 0 ? &qbase_[i] : nullptr;
}

const ParamSpec& GPT::spec(const std::string& name) const {
  for (const auto& p : table_)
    if (p.name == name) return p;
  throw RankError("no parameter named '" + name + "' in this rank's GPT-2 table", MESHLM_HERE);
}

bool GPT::has(const std::string& name) const {
  for (const auto& p : table_)
    if (p.name == name) return true;
  return false;
}

std::span<float> GPT::view(float* base, const std::string& name) const {
  const TensorView t = spec(name).in(base);
  return {t.as<float>(), static_cast<size_t>(t.numel())};
}

BlockTensors GPT::block_tensors(int l, const std::function<float*(size_t)>& at) const {
  const size_t i = first_block_ + static_cast<size_t>(l) * kTensorsPerBlock;
  return {at(i), at(i + 1), at(i + 2), at(i + 3), at(i + 4), at(i + 5),
          at(i + 6), at(i + 7), at(i + 8), at(i + 9), at(i + 10), at(i + 11)};
}

GPTTensors GPT::tensors(float* base) const {
  // Full training: the flat buffer. LoRA: frozen vectors; matrices are null
  // (they are quantized, see qbase()).
  auto at = [&](size_t i) -> float* {
    if (!opts_.lora.enabled) return base + table_[i].offset;
    return frozen_offset_[i] == SIZE_MAX ? nullptr : frozen_.as<float>() + frozen_offset_[i];
  };
  GPTTensors t;
  if (idx_wte_ >= 0) t.wte = at(idx_wte_);
  if (idx_wpe_ >= 0) t.wpe = at(idx_wpe_);
  for (int l = 0; l < n_local_; ++l) t.blocks.push_back(block_tensors(l, at));
  if (idx_lnf_ >= 0) {
    t.lnfw = at(idx_lnf_);
    t.lnfb = at(idx_lnf_ + 1);
  }
  return t;
}

float* GPT::grad_at(size_t index) {
  return opts_.own_grads ? grads() + table_[index].offset : grad_where_(index);
}

void GPT::set_grad_target(std::function<float*(size_t)> where, std::function<void(int)> block_done) {
  MESHLM_CHECK(!opts_.own_grads, "set_grad_target() needs GPTOptions::own_grads = false");
  grad_where_ = std::move(where);
  block_done_ = std::move(block_done);
}

void gpt_init_tensor(const GPTConfig& cfg, const ParamSpec& p, uint64_t seed, float* x) {
  const double kStd = 0.02;
  const double kResidualStd = kStd / std::sqrt(2.0 * cfg.n_layer);
  const size_t n = static_cast<size_t>(p.full_shape.numel());
  Rng rng(Rng::mix_seed(seed, static_cast<uint64_t>(p.index)));
  const bool is_ln_gain = p.name.find("ln_") != std::string::npos && p.name.ends_with(".weight");
  if (p.full_shape.ndim >= 2) {
    const double sd = p.name.ends_with("c_proj.weight") ? kResidualStd : kStd;
    const size_t real_wte = static_cast<size_t>(cfg.vocab_size) * cfg.n_embd;
    const size_t real = (p.name == "wte.weight") ? real_wte : n;  // padded rows stay 0
    for (size_t j = 0; j < real; ++j) x[j] = static_cast<float>(sd * rng.normal());
    for (size_t j = real; j < n; ++j) x[j] = 0.0f;
  } else {
    const float v = is_ln_gain ? 1.0f : 0.0f;
    for (size_t j = 0; j < n; ++j) x[j] = v;
  }
}

void GPT::set_weights(const std::function<void(const ParamSpec&, float*)>& value_of) {
  float* base = params();
  for (const ParamSpec& p : table_) {
    // A split tensor is made whole (workspace) and this rank keeps its part.
    const bool split = p.tp_dim >= 0 && shard_.tp_size > 1;
    Buffer whole;
    if (split)
      whole = Buffer(static_cast<size_t>(p.full_shape.numel()) * sizeof(float),
                     MemCategory::workspace, "gpt.whole_tensor");
    float* x = split ? whole.as<float>() : base + p.offset;
    value_of(p, x);
    if (split) shard_from_full(p, x, base + p.offset, shard_.tp_rank, shard_.tp_size);
  }
}

void GPT::init_weights(uint64_t seed) {
  if (opts_.lora.enabled)
    set_weights([&](const ParamSpec& p, float* x) { lora_init_tensor(p, seed, x); });
  else
    set_weights([&](const ParamSpec& p, float* x) { gpt_init_tensor(cfg_, p, seed, x); });
}

// ---- activations --------------------------------------------------------------

struct GPT::ActLayout {
  std::vector<SlotActs> slots;
  BlockActs recompute{};
  GradActs g{};
  // Every array in allocation order: (where its pointer goes, floats, is a gradient).
  struct Cut {
    float** ptr;
    size_t n;
    bool grad;
  };
  std::vector<Cut> cuts;
  size_t act_floats = 0, grad_floats = 0;
};

GPT::ActLayout GPT::plan_activations(const GPTConfig& cfg, const ModelShard& shard,
                                     const GPTOptions& opts, int B, int Tn) {
  const size_t BT = static_cast<size_t>(B) * Tn, C = cfg.n_embd;
  const size_t tp = shard.tp_size, Cl = C / tp, NHl = cfg.n_head / tp;
  const size_t Fl = 4 * C / tp, Vl = cfg.padded_vocab_size() / tp;
  const int le = shard.layer_end < 0 ? cfg.n_layer : shard.layer_end;
  const int n_local = le - shard.layer_begin;
  const bool full = opts.checkpointing == Checkpointing::full;
  ActLayout L;
  L.slots.resize(opts.slots);
  // The vectors are sized before any pointer into them is recorded.
  for (auto& s : L.slots) s.blocks.assign(n_local, BlockActs{});
  auto cut = [&](float*& p, size_t n, bool grad = false) {
    L.cuts.push_back({&p, n, grad});
    (grad ? L.grad_floats : L.act_floats) += n;
  };
  // Everything of one block but its output (res3).
  auto cut_block_inner = [&](BlockActs& a) {
    cut(a.ln1, BT * C);
    cut(a.ln1_mean, BT);
    cut(a.ln1_rstd, BT);
    cut(a.qkv, BT * 3 * Cl);
    cut(a.atty, BT * Cl);
    cut(a.att, BT * NHl * Tn);
    cut(a.attproj, BT * C);
    cut(a.res2, BT * C);
    cut(a.ln2, BT * C);
    cut(a.ln2_mean, BT);
    cut(a.ln2_rstd, BT);
    cut(a.fch, BT * Fl);
    cut(a.fch_gelu, BT * Fl);
    cut(a.fcproj, BT * C);
  };
  if (full) cut_block_inner(L.recompute);
  for (auto& s : L.slots) {
    cut(s.input, BT * C);
    for (auto& a : s.blocks) {
      if (!full) cut_block_inner(a);
      cut(a.res3, BT * C);
    }
    if (shard.last_stage) {
      cut(s.lnf, BT * C);
      cut(s.lnf_mean, BT);
      cut(s.lnf_rstd, BT);
      cut(s.logits, BT * Vl);
      cut(s.losses, BT);
      cut(s.xent_max, BT);
      cut(s.xent_sums, 2 * BT);
    }
  }
  cut(L.g.dres, BT * C, true);
  cut(L.g.dln, BT * C, true);
  cut(L.g.dqkv, BT * 3 * Cl, true);
  cut(L.g.datty, BT * Cl, true);
  cut(L.g.datt, BT * NHl * Tn, true);
  cut(L.g.dfch, BT * Fl, true);
  cut(L.g.dfch_gelu, BT * Fl, true);
  cut(L.g.dlosses, BT, true);
  if (opts.lora.enabled) {
    const size_t r = opts.lora.rank;
    cut(L.g.lora_u, BT * r, true);
    cut(L.g.lora_du, BT * r, true);
    cut(L.g.lora_tmp, r * C, true);
    cut(L.g.qtile, static_cast<size_t>(quant::kQLinearTileRows) * std::max(C, Fl), true);
    if (shard.first_stage) cut(L.g.wpe_rows, static_cast<size_t>(Tn) * C, true);
  }
  return L;
}

size_t GPT::activation_bytes(const GPTConfig& cfg, const ModelShard& shard,
                             const GPTOptions& opts, int B, int Tn) {
  const ActLayout L = plan_activations(cfg, shard, opts, B, Tn);
  return (L.act_floats + L.grad_floats) * sizeof(float);
}

void GPT::ensure_activations(int B, int Tn) {
  if (B == B_ && Tn == T_) return;
  MESHLM_CHECK(Tn <= cfg_.max_seq_len, "sequence longer than the position table");
  act_buf_ = Buffer();
  grad_act_buf_ = Buffer();
  ActLayout L = plan_activations(cfg_, shard_, opts_, B, Tn);
  act_buf_ = Buffer(L.act_floats * sizeof(float), MemCategory::activations, "gpt.activations");
  grad_act_buf_ = Buffer(L.grad_floats * sizeof(float), MemCategory::activations,
                         "gpt.activation_grads");
  size_t a = 0, g = 0;
  for (auto& c : L.cuts) {
    *c.ptr = c.grad ? grad_act_buf_.as<float>() + g : act_buf_.as<float>() + a;
    (c.grad ? g : a) += c.n;
  }
  if (opts_.checkpointing == Checkpointing::full) {
    // Checkpointed blocks keep their output only; the rest is recomputed
    // into the one shared block.
    for (auto& s : L.slots) {
      for (auto& b : s.blocks) {
        float* res3 = b.res3;
        b = L.recompute;
        b.res3 = res3;
      }
    }
  }
  slots_ = std::move(L.slots);
  recompute_ = L.recompute;
  gacts_ = L.g;
  B_ = B;
  T_ = Tn;
}

float* GPT::stage_input(int slot) { return slots_.at(slot).input; }

const float* GPT::stage_output(int slot) const {
  const SlotActs& s = slots_.at(slot);
  return s.blocks.empty() ? s.input : s.blocks.back().res3;
}

// ---- forward / backward ---------------------------------------------------------

namespace {
void add_bias(float* out, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* o = out + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) o[c] += bias[c];
  }
}

void check_ids(const int32_t* ids, int N, int V, const char* what) {
  for (int i = 0; i < N; ++i) {
    if (ids[i] < 0 || ids[i] >= V)
      throw RankError(std::string(what) + " id " + std::to_string(ids[i]) +
                          " out of range [0, model.vocab_size=" + std::to_string(V) +
                          ") at position " + std::to_string(i) + " of the micro-batch",
                      MESHLM_HERE);
  }
}
}  // namespace

// One transformer block (Megatron tensor parallelism):
//   attention: Y = X A, A split along its columns (heads) across the TP group;
//              Z = Y B, B split along its rows, summed over the group.
//   MLP:       the same with c_fc (columns) and c_proj (rows).
// The sums are the only communication of a block's forward; the biases of the
// row-parallel layers are added once, after the sum.
void GPT::block_forward(int l, const BlockTensors& w, BlockActs& a, const float* x, int B, int Tn) {
  const int tp = shard_.tp_size, C = cfg_.n_embd, Cl = C / tp, NHl = cfg_.n_head / tp;
  const int Fl = 4 * C / tp, N = B * Tn;
  const size_t NC = static_cast<size_t>(N) * C;
  const bool split = tp > 1;
  ops::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1w, w.ln1b, N, C);
  tp_.copy_to_region_forward(a.ln1, NC);
  linear_forward(l, 0, a.qkv, a.ln1, w.qkvw, w.qkvb, N, C, 3 * Cl);
  ops::attention_forward(a.atty, a.att, a.qkv, B, Tn, Cl, NHl);
  linear_forward(l, 1, a.attproj, a.atty, w.attprojw, split ? nullptr : w.attprojb, N, Cl, C);
  if (split) {
    tp_.reduce_from_region_forward(a.attproj, NC);
    add_bias(a.attproj, w.attprojb, N, C);
  }
  ops::residual_forward(a.res2, x, a.attproj, NC);
  ops::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2w, w.ln2b, N, C);
  tp_.copy_to_region_forward(a.ln2, NC);
  linear_forward(l, 2, a.fch, a.ln2, w.fcw, w.fcb, N, C, Fl);
  ops::gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * Fl);
  linear_forward(l, 3, a.fcproj, a.fch_gelu, w.fcprojw, split ? nullptr : w.fcprojb, N, Fl, C);
  if (split) {
    tp_.reduce_from_region_forward(a.fcproj, NC);
    add_bias(a.fcproj, w.fcprojb, N, C);
  }
  ops::residual_forward(a.res3, a.res2, a.fcproj, NC);
}

namespace {
// Table offsets of the four matrices inside a block's tensors (gpt_param_table order).
constexpr size_t kTargetOffset[kLinearSlots] = {2, 4, 8, 10};
}  // namespace

void GPT::linear_forward(int l, int t, float* out, const float* inp, const float* w,
                         const float* bias, int N, int IC, int OC) {
  if (const quant::QSlice* q = qbase(first_block_ + l * kTensorsPerBlock + kTargetOffset[t]))
    quant::qlinear_forward(out, inp, *q, bias, N, gacts_.qtile);
  else
    ops::matmul_forward(out, inp, w, bias, N, IC, OC);
  const int a = lora_index_[l][t];
  if (a < 0) return;
  // Column-parallel: u = x A^T is whole on every rank, B's rows are this
  // rank's outputs. Row-parallel: u is this rank's partial sum, and so is
  // s u B^T, which the sum over the group completes, like x W^T.
  lora_forward(out, inp, params() + table_[a].offset, params() + table_[a + 1].offset,
               opts_.lora.scale(), N, IC, OC, opts_.lora.rank, gacts_.lora_u);
}

void GPT::linear_backward(int l, int t, float* dinp, float* dw, float* dbias, const float* dout,
                          const float* inp, const float* w, int N, int IC, int OC) {
  if (const quant::QSlice* q = qbase(first_block_ + l * kTensorsPerBlock + kTargetOffset[t]))
    quant::qlinear_backward_input(dinp, dout, *q, N, gacts_.qtile);  // frozen: no dW, no dbias
  else
    ops::matmul_backward(dinp, dw, dbias, dout, inp, w, N, IC, OC);
  const int a = lora_index_[l][t];
  if (a < 0) return;
  const ParamSpec &sa = table_[a], &sb = table_[a + 1];
  // The replicated factor (A of a column-parallel layer, B of a row-parallel
  // one) gets a partial gradient on each TP rank: computed apart, summed over
  // the group, then accumulated.
  const bool split = shard_.tp_size > 1;
  const bool a_partial = split && sa.tp_dim < 0, b_partial = split && sb.tp_dim < 0;
  float* dA = grad_at(a);
  float* dB = grad_at(a + 1);
  float* tmp = gacts_.lora_tmp;
  if (a_partial) std::memset(tmp, 0, sa.numel() * sizeof(float));
  if (b_partial) std::memset(tmp, 0, sb.numel() * sizeof(float));
  lora_backward(dinp, a_partial ? tmp : dA, b_partial ? tmp : dB, dout, inp,
                params() + sa.offset, params() + sb.offset, opts_.lora.scale(), N, IC, OC,
                opts_.lora.rank, gacts_.lora_u, gacts_.lora_du);
  if (a_partial || b_partial) {
    const size_t n = a_partial ? sa.numel() : sb.numel();
    float* g = a_partial ? dA : dB;
    tp_.sum_over_region(tmp, n);
    for (size_t i = 0; i < n; ++i) g[i] += tmp[i];
  }
}

float GPT::forward(int slot, const int32_t* tokens, const int32_t* targets, int B, int Tn) {
  ensure_activations(B, Tn);
  MESHLM_CHECK(slot >= 0 && slot < opts_.slots, "activation slot out of range");
  SlotActs& s = slots_[slot];
  const int C = cfg_.n_embd, V = cfg_.vocab_size, tp = shard_.tp_size;
  const int Vl = cfg_.padded_vocab_size() / tp, v0 = shard_.tp_rank * Vl, N = B * Tn;
  const GPTTensors p = tensors(params());
  if (shard_.first_stage) {
    check_ids(tokens, N, V, "token");
    s.tokens.assign(tokens, tokens + N);
    // Vocabulary-parallel lookup: each rank contributes the rows it holds.
    if (const quant::QSlice* q = qbase(idx_wte_)) {
      for (int n = 0; n < N; ++n) {
        float* o = s.input + static_cast<size_t>(n) * C;
        const int v = tokens[n] - v0;
        if (v >= 0 && v < Vl)
          quant::dequantize_rows(*q, v, 1, o);
        else
          std::memset(o, 0, C * sizeof(float));
      }
    } else {
      ops::embedding_forward(s.input, tokens, p.wte, N, C, v0, Vl);
    }
    tp_.reduce_from_region_forward(s.input, static_cast<size_t>(N) * C);
    if (const quant::QSlice* q = qbase(idx_wpe_)) {
      quant::dequantize_rows(*q, 0, Tn, gacts_.wpe_rows);
      ops::position_forward(s.input, static_cast<const float*>(gacts_.wpe_rows), B, Tn, C);
    } else {
      ops::position_forward(s.input, p.wpe, B, Tn, C);
    }
  }
  const float* x = s.input;
  for (int l = 0; l < n_local_; ++l) {
    block_forward(l, p.blocks[l], s.blocks[l], x, B, Tn);
    x = s.blocks[l].res3;
  }
  s.forwarded = true;
  if (!shard_.last_stage) return 0.0f;

  check_ids(targets, N, V, "target");
  s.targets.assign(targets, targets + N);
  ops::layernorm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, x, p.lnfw, p.lnfb, N, C);
  tp_.copy_to_region_forward(s.lnf, static_cast<size_t>(N) * C);
  // lm_head tied to wte, vocabulary-parallel: logits(N,Vl) = lnf(N,C) wte_part(Vl,C)^T;
  // the softmax is assembled from two small reductions, never from all logits.
  if (const quant::QSlice* q = qbase(idx_wte_))
    quant::qlinear_forward(s.logits, s.lnf, *q, nullptr, N, gacts_.qtile);
  else
    ops::matmul_forward<float>(s.logits, s.lnf, p.wte, nullptr, N, C, Vl);
  ops::xent_local_max(s.xent_max, s.logits, N, Vl, v0, V);
  tp_.max_over_region(s.xent_max, N);
  ops::xent_local_sums(s.xent_sums, s.logits, s.xent_max, targets, N, Vl, v0, V);
  tp_.sum_over_region(s.xent_sums, 2 * static_cast<size_t>(N));
  ops::xent_losses(s.losses, s.xent_max, s.xent_sums, N);
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += s.losses[i];
  return static_cast<float>(sum / N);
}

void GPT::zero_grads() {
  if (opts_.own_grads) std::memset(grads(), 0, padded_params_ * sizeof(float));
}

void GPT::backward(int slot, float loss_scale) {
  MESHLM_CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()), "activation slot out of range");
  SlotActs& s = slots_[slot];
  MESHLM_CHECK(s.forwarded, "backward() needs a forward() of its own first");
  const int B = B_, Tn = T_, tp = shard_.tp_size;
  const int C = cfg_.n_embd, Cl = C / tp, NHl = cfg_.n_head / tp, Fl = 4 * C / tp;
  const int V = cfg_.vocab_size, Vl = cfg_.padded_vocab_size() / tp, v0 = shard_.tp_rank * Vl;
  const int N = B * Tn;
  const size_t NC = static_cast<size_t>(N) * C;
  const GPTTensors p = tensors(params());
  // Gradients of base tensors: none when the base is frozen (LoRA).
  const bool frozen = opts_.lora.enabled;
  auto gat = [&](size_t i) { return frozen ? nullptr : grad_at(i); };
  auto zero = [](float* a, size_t n) { std::memset(a, 0, n * sizeof(float)); };
  const bool full = opts_.checkpointing == Checkpointing::full;

  if (shard_.last_stage) {
    // Loss = loss_scale * mean_n losses[n]
    const float dl = loss_scale / static_cast<float>(N);
    for (int i = 0; i < N; ++i) gacts_.dlosses[i] = dl;
    ops::xent_local_backward(s.logits, s.xent_max, s.xent_sums, gacts_.dlosses, s.targets.data(),
                             N, Vl, v0, V);
    // lm_head: dlnf = dlogits wte_part summed over TP; dwte_part += dlogits^T lnf
    zero(gacts_.dln, NC);
    if (const quant::QSlice* q = qbase(idx_wte_))
      quant::qlinear_backward_input(gacts_.dln, s.logits, *q, N, gacts_.qtile);
    else
      ops::matmul_backward<float>(gacts_.dln, grad_at(idx_wte_), nullptr, s.logits, s.lnf, p.wte,
                                  N, C, Vl);
    tp_.copy_to_region_backward(gacts_.dln, NC);
    zero(gacts_.dres, NC);
    ops::layernorm_backward(gacts_.dres, gat(idx_lnf_), gat(idx_lnf_ + 1), gacts_.dln,
                            stage_output(slot), p.lnfw, s.lnf_mean, s.lnf_rstd, N, C);
  }
  // dres holds d loss / d (output of block l); walking down, the residual
  // adds pass it through unchanged and each branch accumulates into it.
  for (int l = n_local_ - 1; l >= 0; --l) {
    const BlockTensors& w = p.blocks[l];
    const BlockTensors gw = block_tensors(l, gat);
    BlockActs& a = s.blocks[l];
    const float* x = (l == 0) ? s.input : s.blocks[l - 1].res3;
    if (full) block_forward(l, w, a, x, B, Tn);  // recompute from the kept input

    // MLP branch: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2))))
    tp_.reduce_from_region_backward(gacts_.dres, NC);
    zero(gacts_.dfch_gelu, static_cast<size_t>(N) * Fl);
    linear_backward(l, 3, gacts_.dfch_gelu, gw.fcprojw, gw.fcprojb, gacts_.dres, a.fch_gelu,
                    w.fcprojw, N, Fl, C);
    zero(gacts_.dfch, static_cast<size_t>(N) * Fl);
    ops::gelu_backward(gacts_.dfch, a.fch, gacts_.dfch_gelu, static_cast<size_t>(N) * Fl);
    zero(gacts_.dln, NC);
    linear_backward(l, 2, gacts_.dln, gw.fcw, gw.fcb, gacts_.dfch, a.ln2, w.fcw, N, C, Fl);
    tp_.copy_to_region_backward(gacts_.dln, NC);
    ops::layernorm_backward(gacts_.dres, gw.ln2w, gw.ln2b, gacts_.dln, a.res2, w.ln2w, a.ln2_mean,
                            a.ln2_rstd, N, C);

    // Attention branch: res2 = x + c_proj(attn(c_attn(ln_1(x))))
    tp_.reduce_from_region_backward(gacts_.dres, NC);
    zero(gacts_.datty, static_cast<size_t>(N) * Cl);
    linear_backward(l, 1, gacts_.datty, gw.attprojw, gw.attprojb, gacts_.dres, a.atty,
                    w.attprojw, N, Cl, C);
    zero(gacts_.dqkv, static_cast<size_t>(N) * 3 * Cl);
    ops::attention_backward(gacts_.dqkv, gacts_.datt, gacts_.datty, a.qkv, a.att, B, Tn, Cl, NHl);
    zero(gacts_.dln, NC);
    linear_backward(l, 0, gacts_.dln, gw.qkvw, gw.qkvb, gacts_.dqkv, a.ln1, w.qkvw, N, C, 3 * Cl);
    tp_.copy_to_region_backward(gacts_.dln, NC);
    ops::layernorm_backward(gacts_.dres, gw.ln1w, gw.ln1b, gacts_.dln, x, w.ln1w, a.ln1_mean,
                            a.ln1_rstd, N, C);
    if (block_done_) block_done_(shard_.layer_begin + l);
  }
  if (shard_.first_stage && !frozen) {
    tp_.reduce_from_region_backward(gacts_.dres, NC);
    ops::embedding_backward(grad_at(idx_wte_), gacts_.dres, s.tokens.data(), N, C, v0, Vl);
    ops::position_backward(grad_at(idx_wpe_), gacts_.dres, B, Tn, C);
  }
  // logits now hold dlogits: a second backward() needs a new forward().
  s.forwarded = false;
}

}  // namespace meshlm
