#include "model/param_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace meshlm {

std::vector<ParamSpec> gpt_param_table(const GPTConfig& cfg, const ModelShard& shard) {
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab_size(), maxT = cfg.max_seq_len;
  const int tp = shard.tp_size;
  const int lb = shard.layer_begin, le = shard.layer_end < 0 ? cfg.n_layer : shard.layer_end;
  MESHLM_CHECK(cfg.arch == ModelArch::gpt2, "gpt_param_table of a model that is not GPT-2");
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

std::vector<ops::AdamWSegment> table_segments(const std::vector<ParamSpec>& table, size_t begin,
                                              size_t end) {
  std::vector<ops::AdamWSegment> segments;
  for (const ParamSpec& p : table) {
    const size_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.numel(), end);
    if (lo < hi) segments.push_back({lo - begin, hi - lo, p.decay()});
  }
  return segments;
}

bool counted_in_grad_norm(const ParamSpec& p, int tp_rank, bool first_stage) {
  if (p.tp_dim < 0 && tp_rank > 0) return false;
  return p.tied == TiedGroup::none || first_stage;
}

const ParamSpec* find_role(const std::vector<ParamSpec>& table, ParamRole role) {
  for (const ParamSpec& p : table)
    if (p.role == role) return &p;
  return nullptr;
}

size_t row_floats(const ParamSpec& s) {
  return s.full_shape.ndim <= 1 ? 1 : static_cast<size_t>(s.full_shape.numel() / s.full_shape[0]);
}

int64_t rows_per_block(const ParamSpec& s, size_t max_floats, size_t align) {
  const int64_t rows = s.full_shape[0];
  const size_t rf = row_floats(s);
  const int64_t fit = static_cast<int64_t>(std::max<size_t>(1, max_floats / rf));
  if (fit >= rows) return rows;
  // Rows per step so that a block's element count is a multiple of align.
  const int64_t step = static_cast<int64_t>(align / std::gcd(align, rf));
  return std::min(rows, std::max(step, fit / step * step));
}

void shard_from_full(const ParamSpec& spec, const float* full, float* part, int tp_rank,
                     int tp_size) {
  for_each_part_run(spec, 0, spec.full_shape[0], tp_rank, tp_size,
                    [&](size_t from, size_t to, size_t n) {
                      std::memcpy(part + to, full + from, n * sizeof(float));
                    });
}

void shard_to_full(const ParamSpec& spec, const float* part, float* full, int tp_rank,
                   int tp_size) {
  for_each_part_run(spec, 0, spec.full_shape[0], tp_rank, tp_size,
                    [&](size_t from, size_t to, size_t n) {
                      std::memcpy(full + from, part + to, n * sizeof(float));
                    });
}

void init_tensor(const GPTConfig& cfg, const ParamSpec& p, uint64_t seed, float* x) {
  init_tensor_rows(cfg, p, seed, 0, p.full_shape[0], x);
}

void init_tensor_rows(const GPTConfig& cfg, const ParamSpec& p, uint64_t seed, int64_t row0,
                      int64_t nrows, float* x) {
  const double kStd = 0.02;
  const size_t rf = row_floats(p), first = static_cast<size_t>(row0) * rf,
               n = static_cast<size_t>(nrows) * rf;
  MESHLM_CHECK(row0 >= 0 && nrows >= 0 && row0 + nrows <= p.full_shape[0],
               p.name + ": rows out of the tensor");
  // One stream per tensor, element j from its (2j)-th draw (normal) or j-th
  // (uniform): threads fill blocks of kBlock elements (counted from the
  // tensor's start) at once, the same values as one thread walking the
  // stream, whatever rows are asked for.
  constexpr size_t kBlock = size_t{1} << 16;
  const long b0 = static_cast<long>(first / kBlock),
             b1 = static_cast<long>((first + n + kBlock - 1) / kBlock);
  auto fill = [&](const Rng& start, int draws, auto&& value) {
#pragma omp parallel for schedule(static)
    for (long b = b0; b < b1; ++b) {
      const size_t j0 = std::max(first, static_cast<size_t>(b) * kBlock),
                   j1 = std::min(first + n, static_cast<size_t>(b + 1) * kBlock);
      Rng rng = start;
      rng.skip(static_cast<uint64_t>(draws) * j0);
      for (size_t j = j0; j < j1; ++j) x[j - first] = value(rng, j);
    }
  };
  auto fill_normal = [&](double sd, size_t real) {
    fill(Rng(Rng::mix_seed(seed, static_cast<uint64_t>(p.index))), 2, [&](Rng& rng, size_t j) {
      return j < real ? static_cast<float>(sd * rng.normal()) : 0.0f;
    });
  };
  switch (p.init) {
    case InitKind::normal:
      fill_normal(kStd, first + n);
      return;
    case InitKind::normal_residual:
      fill_normal(kStd / std::sqrt(2.0 * cfg.n_layer), first + n);
      return;
    case InitKind::normal_vocab:
      fill_normal(kStd, static_cast<size_t>(cfg.vocab_size) * p.full_shape.dims[1]);
      return;
    case InitKind::zeros:
    case InitKind::ones:
      std::fill(x, x + n, p.init == InitKind::ones ? 1.0f : 0.0f);
      return;
    case InitKind::kaiming_uniform: {
      // With a = sqrt(5), as torch.nn.Linear and PEFT: bound 1/sqrt(IC).
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.full_shape.dims[1]));
      fill(Rng(Rng::mix_seed(seed ^ kLoraSeedSalt, static_cast<uint64_t>(p.index))), 1,
           [&](Rng& rng, size_t) { return static_cast<float>(bound * (2.0 * rng.uniform() - 1.0)); });
      return;
    }
  }
}

int64_t TensorBox::numel() const {
  int64_t n = 1;
  for (int64_t c : count) n *= c;
  return n;
}

namespace {

// The elements [lo, hi) (row-major) of the sub-array of `dims` from
// dimension d on, inside `box` (whose dimensions before d are fixed), as
// boxes in order.
void flat_range_boxes(const std::vector<int64_t>& dims, size_t d, int64_t lo, int64_t hi,
                      TensorBox box, std::vector<TensorBox>& out) {
  if (lo >= hi) return;
  int64_t inner = 1;
  for (size_t k = d + 1; k < dims.size(); ++k) inner *= dims[k];
  auto whole_below = [&](TensorBox& b) {
    for (size_t k = d + 1; k < dims.size(); ++k) {
      b.start[k] = 0;
      b.count[k] = dims[k];
    }
  };
  if (d + 1 == dims.size()) {
    box.start[d] = lo;
    box.count[d] = hi - lo;
    out.push_back(box);
    return;
  }
  const int64_t first_full = (lo + inner - 1) / inner, last_full = hi / inner;
  if (first_full > last_full) {  // inside one slice of dimension d
    const int64_t i = lo / inner;
    box.start[d] = i;
    box.count[d] = 1;
    flat_range_boxes(dims, d + 1, lo - i * inner, hi - i * inner, box, out);
    return;
  }
  if (lo < first_full * inner) {
    box.start[d] = first_full - 1;
    box.count[d] = 1;
    flat_range_boxes(dims, d + 1, lo - (first_full - 1) * inner, inner, box, out);
  }
  if (last_full > first_full) {
    TensorBox b = box;
    b.start[d] = first_full;
    b.count[d] = last_full - first_full;
    whole_below(b);
    out.push_back(b);
  }
  if (hi > last_full * inner) {
    box.start[d] = last_full;
    box.count[d] = 1;
    flat_range_boxes(dims, d + 1, 0, hi - last_full * inner, box, out);
  }
}

}  // namespace

std::vector<TensorBox> part_boxes(const ParamSpec& spec, int tp_rank, int tp_size, size_t a,
                                  size_t b) {
  std::vector<TensorBox> local, out;
  const Shape& s = spec.shape;
  if (a >= b) return out;
  std::vector<int64_t> dims(s.dims.begin(), s.dims.begin() + s.ndim);
  if (dims.empty()) dims.push_back(1);
  TensorBox box{std::vector<int64_t>(dims.size(), 0), std::vector<int64_t>(dims.size(), 1)};
  flat_range_boxes(dims, 0, static_cast<int64_t>(a), static_cast<int64_t>(b), box, local);
  const int t = spec.tp_dim;
  if (t < 0 || tp_size == 1) return local;
  // Along tp_dim the part is tp_parts pieces, each `piece` long; piece p of
  // the part is [p per_part + tp_rank piece, ... + piece) of the logical tensor.
  const int64_t full = spec.full_shape.dims[t], per_part = full / spec.tp_parts,
                piece = per_part / tp_size;
  for (const TensorBox& l : local) {
    const int64_t x0 = l.start[t], x1 = x0 + l.count[t];
    for (int64_t p = x0 / piece; p * piece < x1; ++p) {
      const int64_t lo = std::max(x0, p * piece), hi = std::min(x1, (p + 1) * piece);
      TensorBox g = l;
      g.start[t] = p * per_part + tp_rank * piece + (lo - p * piece);
      g.count[t] = hi - lo;
      out.push_back(g);
    }
  }
  return out;
}

}  // namespace meshlm
