#include "model/param_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"

namespace meshlm {

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
  using R = ParamRole;
  using I = InitKind;
  b.add({.name = "wte.weight", .tp_dim = 0, .full_shape = {Vp, C}, .role = R::token_embedding,
         .init = I::normal_vocab, .tied = TiedGroup::embedding},
        first || last);
  b.add({.name = "wpe.weight", .full_shape = {maxT, C}, .role = R::position_embedding,
         .init = I::normal},
        first);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const bool mine = lb <= l && l < le;
    auto norm = [&](const char* n, R gain, R bias) {
      b.add({.name = h + n + ".weight", .layer = l, .full_shape = {C}, .role = gain,
             .init = I::ones},
            mine);
      b.add({.name = h + n + ".bias", .layer = l, .full_shape = {C}, .role = bias,
             .init = I::zeros},
            mine);
    };
    // tp_dim 0: column-parallel (rows split, in `parts` parts); 1: row-parallel.
    auto linear = [&](const char* n, LinearSlot slot, int64_t OC, int64_t IC, int tp_dim,
                      int parts, I init) {
      b.add({.name = h + n + ".weight", .tp_dim = tp_dim, .layer = l, .full_shape = {OC, IC},
             .tp_parts = parts, .role = R::linear_weight, .slot = slot, .init = init},
            mine);
      b.add({.name = h + n + ".bias", .tp_dim = tp_dim == 0 ? 0 : -1, .layer = l,
             .full_shape = {OC}, .tp_parts = parts, .role = R::linear_bias, .slot = slot,
             .init = I::zeros},
            mine);
    };
    norm("ln_1", R::ln1_weight, R::ln1_bias);
    linear("attn.c_attn", LinearSlot::qkv, 3 * C, C, 0, 3, I::normal);
    linear("attn.c_proj", LinearSlot::attn_out, C, C, 1, 1, I::normal_residual);
    norm("ln_2", R::ln2_weight, R::ln2_bias);
    linear("mlp.c_fc", LinearSlot::mlp_up, 4 * C, C, 0, 1, I::normal);
    linear("mlp.c_proj", LinearSlot::mlp_down, C, 4 * C, 1, 1, I::normal_residual);
  }
  b.add({.name = "ln_f.weight", .full_shape = {C}, .role = R::lnf_weight, .init = I::ones}, last);
  b.add({.name = "ln_f.bias", .full_shape = {C}, .role = R::lnf_bias, .init = I::zeros}, last);
  return b.take();
}

void TableBuilder::add(ParamSpec p, bool keep) {
  p.index = index_++;
  if (!keep) return;
  p.shape = p.full_shape;
  if (p.tp_dim >= 0) {
    MESHLM_CHECK(p.full_shape.dims[p.tp_dim] % (static_cast<int64_t>(p.tp_parts) * tp_) == 0,
                 p.name + " does not split evenly over the tensor-parallel group");
    p.shape.dims[p.tp_dim] /= tp_;
  }
  p.offset = offset_;
  offset_ += p.numel();
  table_.push_back(std::move(p));
}

size_t table_numel(const std::vector<ParamSpec>& table) {
  return table.empty() ? 0 : table.back().offset + table.back().numel();
}

const ParamSpec* find_role(const std::vector<ParamSpec>& table, ParamRole role) {
  for (const ParamSpec& p : table)
    if (p.role == role) return &p;
  return nullptr;
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

void init_tensor(const GPTConfig& cfg, const ParamSpec& p, uint64_t seed, float* x) {
  const double kStd = 0.02;
  const size_t n = static_cast<size_t>(p.full_shape.numel());
  // One stream per tensor, element j from its (2j)-th draw on (normal) or
  // j-th (uniform): filled by all threads in blocks, the same values as one
  // thread walking the stream.
  constexpr long kBlock = 1 << 16;
  const long nblocks = static_cast<long>((n + kBlock - 1) / kBlock);
  auto fill_normal = [&](double sd, size_t real) {
    const Rng start(Rng::mix_seed(seed, static_cast<uint64_t>(p.index)));
#pragma omp parallel for schedule(static)
    for (long b = 0; b < nblocks; ++b) {
      const size_t j0 = static_cast<size_t>(b) * kBlock, j1 = std::min(n, j0 + kBlock);
      Rng rng = start;
      rng.skip(2 * j0);
      for (size_t j = j0; j < j1; ++j) x[j] = j < real ? static_cast<float>(sd * rng.normal()) : 0.0f;
    }
  };
  switch (p.init) {
    case InitKind::normal:
      fill_normal(kStd, n);
      return;
    case InitKind::normal_residual:
      fill_normal(kStd / std::sqrt(2.0 * cfg.n_layer), n);
      return;
    case InitKind::normal_vocab:
      fill_normal(kStd, static_cast<size_t>(cfg.vocab_size) * p.full_shape.dims[1]);
      return;
    case InitKind::zeros:
    case InitKind::ones:
      for (size_t j = 0; j < n; ++j) x[j] = p.init == InitKind::ones ? 1.0f : 0.0f;
      return;
    case InitKind::kaiming_uniform: {
      // With a = sqrt(5), as torch.nn.Linear and PEFT: bound 1/sqrt(IC).
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.full_shape.dims[1]));
      const Rng start(Rng::mix_seed(seed ^ kLoraSeedSalt, static_cast<uint64_t>(p.index)));
#pragma omp parallel for schedule(static)
      for (long b = 0; b < nblocks; ++b) {
        const size_t j0 = static_cast<size_t>(b) * kBlock, j1 = std::min(n, j0 + kBlock);
        Rng rng = start;
        rng.skip(j0);
        for (size_t j = j0; j < j1; ++j)
          x[j] = static_cast<float>(bound * (2.0 * rng.uniform() - 1.0));
      }
      return;
    }
  }
}

}  // namespace meshlm
