// The parameter table: every trained tensor of a rank as (name, role, shape,
// offset into one flat buffer, the dimension tensor parallelism splits).
//
// The parameters are ONE allocation plus this table. Gradients use the same
// table on a second buffer of the same size; optimizer state, ZeRO shards,
// checkpoint datasets and LoRA adapters are derived from it. Code finds a
// tensor by its role (ParamRole, LinearSlot, TiedGroup, InitKind), never by
// its name or its position: the name is for files only.
//
// Names follow the Hugging Face GPT-2 checkpoint (wte.weight, h.0.attn.c_attn.
// weight, ...) so that imported weights map by name, but linear weights are
// stored (out, in) like torch.nn.Linear (HF's Conv1D stores them transposed).
//
// One rank holds a SHARD of the model (ModelShard): the layers of its
// pipeline stage (plus the embedding on the first stage, ln_f and the tied
// lm_head on the last), each split tensor cut to its tensor-parallel part
// (Megatron style, see tp_dim below). The table of a shard lists the local
// shapes; full_shape and tp_parts say where the shard sits in the logical
// tensor, so checkpoints and tests can always speak of the whole model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/gpt_config.h"
#include "model/linear_slot.h"

namespace meshlm::ops {
struct AdamWSegment;
}

namespace meshlm {

// What a tensor is to the model.
enum class ParamRole : uint8_t {
  token_embedding,     // wte (Vp, C); also the lm_head (tied)
  position_embedding,  // wpe (maxT, C)
  ln1_weight,          // a block's LayerNorm before attention: gain (C)
  ln1_bias,            //   and bias (C)
  ln2_weight,          // a block's LayerNorm before the MLP
  ln2_bias,
  lnf_weight,          // the final LayerNorm (last stage)
  lnf_bias,
  linear_weight,       // a block's linear layer `slot`: (OC, IC)
  linear_bias,         //   and its bias (OC)
  lora_a,              // the LoRA adapter of linear layer `slot`: A (r, IC)
  lora_b,              //   and B (OC, r)
  lm_head,             // an untied classifier (Vp, C) (Llama, tie_word_embeddings = false)
};

// How a logical tensor starts (init_tensor).
enum class InitKind : uint8_t {
  normal,           // N(0, 0.02)
  normal_residual,  // N(0, 0.02 / sqrt(2 L)): projections into the residual stream
  normal_vocab,     // N(0, 0.02) on the vocabulary's rows, zero on the padded rows
  zeros,
  ones,
  kaiming_uniform,  // uniform(-1/sqrt(IC), 1/sqrt(IC)), as torch.nn.Linear (LoRA A)
};

// Tensors held by more than one pipeline stage as one logical tensor: their
// gradients are summed between those stages, they count once in the global
// gradient norm, and their copies must agree.
enum class TiedGroup : uint8_t {
  none,
  embedding,  // wte: the first stage's token embedding, the last stage's lm_head
};

struct ParamSpec {
  std::string name;  // also the HDF5 dataset name under /params
  Shape shape{};     // this rank's part (== full_shape without tensor parallelism)
  size_t offset = 0;  // in elements, into the flat buffer
  int tp_dim = -1;    // dimension split by tensor parallelism; -1 = replicated
  int layer = -1;     // transformer block, -1 for embeddings and final norm
  Shape full_shape;   // the logical tensor
  int tp_parts = 1;   // tp_dim is made of this many equal parts (q, k, v), each split
  int index = 0;      // position in the table of the whole model (seeds its init stream)
  ParamRole role = ParamRole::linear_weight;
  std::optional<LinearSlot> slot{};  // linear layers and their adapters
  InitKind init = InitKind::zeros;
  TiedGroup tied = TiedGroup::none;

  bool decay() const { return shape.ndim >= 2; }  // AdamW decays matrices only
  size_t numel() const { return static_cast<size_t>(shape.numel()); }
  // This tensor inside a flat fp32 buffer laid out by the table.
  TensorView in(float* base) const { return {base + offset, shape, DType::f32, Device::cpu}; }
};

// Which part of the model one rank holds: the layers [layer_begin,
// layer_end) of its pipeline stage, and part tp_rank of tp_size of every
// tensor that tensor parallelism splits. The default is the whole model.
struct ModelShard {
  int tp_rank = 0, tp_size = 1;
  int layer_begin = 0, layer_end = -1;  // -1 = n_layer
  bool first_stage = true;              // holds wte + wpe, takes tokens
  bool last_stage = true;               // holds ln_f + lm_head (tied wte), computes the loss
  auto operator<=>(const ModelShard&) const = default;  // a map's key (the planner's)
};

// Builds a table in memory order for one shard: add() is called for every
// tensor of the whole model, in order (its position becomes spec.index);
// those the shard keeps get their local shape (tp_dim divided by tp_size)
// and the next offset. `spec` gives name, full_shape, tp_dim, tp_parts,
// layer and the roles.
class TableBuilder {
public:
  explicit TableBuilder(int tp_size) : tp_(tp_size) {}
  void add(ParamSpec spec, bool keep);
  std::vector<ParamSpec> take() { return std::move(table_); }

private:
  int tp_ = 1, index_ = 0;
  size_t offset_ = 0;
  std::vector<ParamSpec> table_;
};

// The GPT-2 table, in memory order: wte (first or last stage), wpe (first
// stage), the stage's blocks, ln_f (last stage). Without a shard: the whole
// model.
std::vector<ParamSpec> gpt_param_table(const GPTConfig& cfg, const ModelShard& shard = {});
// The Llama table, in memory order: embed_tokens (first stage; also the last
// stage's classifier when tied), the stage's blocks (input_layernorm, q, k,
// v, o, post_attention_layernorm, gate, up, down; no biases), norm and, when
// untied, lm_head (last stage). Names are Hugging Face's without "model.".
// Tensor parallelism splits q, gate, up (rows) and o, down (columns) by
// heads and width, k and v by key/value heads where n_kv_head is a multiple
// of tp (replicated otherwise), embed_tokens and lm_head by vocabulary rows.
std::vector<ParamSpec> llama_param_table(const GPTConfig& cfg, const ModelShard& shard = {});
// The table of cfg.arch. The tables made on the calling thread for one cfg
// are kept (up to kKeptTables shards) and given again for the same shard:
// the planner asks for each rank's table many times per layout, and building
// one (a name formatted per tensor) took 40% of a plan's time;
// shared_param_table gives the kept table itself, without a copy.
inline constexpr size_t kKeptTables = 1024;
std::vector<ParamSpec> model_param_table(const GPTConfig& cfg, const ModelShard& shard = {});
std::shared_ptr<const std::vector<ParamSpec>> shared_param_table(const GPTConfig& cfg,
                                                                 const ModelShard& shard = {});
size_t table_numel(const std::vector<ParamSpec>& table);
// The tensors' parts inside the elements [begin, end) of the flat buffer,
// relative to begin, in table order: what AdamW updates (train/adamw.h),
// and on a GPU the table of them it keeps on the device (optimizer memory,
// one ops::AdamWSegment each: the memory prediction counts them).
std::vector<ops::AdamWSegment> table_segments(const std::vector<ParamSpec>& table, size_t begin,
                                              size_t end);
// Whether the global gradient norm counts tensor p's gradient on this rank
// (TP rank tp_rank, a stage that is or is not the first): each logical
// element once, replicated tensors on TP rank 0 only, tied tensors on the
// first stage that holds them only (train/engine.cpp; the GPU's scratch of
// the norm, plan/memory.cpp, counts the same spans).
bool counted_in_grad_norm(const ParamSpec& p, int tp_rank, bool first_stage);
// The first entry of `table` with `role`, or null (the tensors outside the
// blocks, which a table holds once).
const ParamSpec* find_role(const std::vector<ParamSpec>& table, ParamRole role);

// Copies between a logical tensor (spec.full_shape, row-major) and this
// rank's part of it (spec.shape) for tensor-parallel rank tp_rank of tp_size.
void shard_from_full(const ParamSpec& spec, const float* full, float* part, int tp_rank,
                     int tp_size);
void shard_to_full(const ParamSpec& spec, const float* part, float* full, int tp_rank,
                   int tp_size);

// A logical tensor is worked on in blocks of whole rows (its first
// dimension; a 1-D tensor's rows are its elements) wherever holding all of
// it would cost memory: reading and quantizing the frozen base, and setting
// a tensor-parallel rank's part. row_floats is the length of one row.
size_t row_floats(const ParamSpec& spec);
// The rows of one block: as many as fit in `max_floats` (at least one, and
// never more than the tensor has), rounded down to a multiple of the rows
// that make a multiple of `align` elements (a quantization block) unless the
// block is the whole tensor.
int64_t rows_per_block(const ParamSpec& spec, size_t max_floats, size_t align = 1);
// For rows [row0, row0 + nrows) of the logical tensor: each run of elements
// that belongs to tensor-parallel rank tp_rank's part, as fn(from, to,
// count): `from` counts from the block's first element, `to` from the
// part's. Runs come in the order of the logical tensor.
template <typename Fn>
void for_each_part_run(const ParamSpec& spec, int64_t row0, int64_t nrows, int tp_rank,
                       int tp_size, Fn&& fn);

// A box of a logical tensor: the elements start[d] <= i_d < start[d] +
// count[d] of every dimension d (spec.full_shape's rank).
struct TensorBox {
  std::vector<int64_t> start, count;
  int64_t numel() const;
};
// Where the elements [a, b) of tensor-parallel rank tp_rank's part (spec.
// shape, row-major) lie in the logical tensor: boxes whose elements, taken
// in the logical tensor's row-major order, are those elements in order (a
// part's coordinates map to the logical ones increasingly, dimension by
// dimension). What a rank reads or writes of a checkpoint's dataset: at most
// (2 ndim - 1) * tp_parts boxes.
std::vector<TensorBox> part_boxes(const ParamSpec& spec, int tp_rank, int tp_size, size_t a,
                                  size_t b);

// The initial value of the logical tensor `spec` (full_shape, written whole
// to `out`) by its spec.init. Each tensor has its own stream seeded from
// (seed, spec.index), LoRA adapters from a stream apart (seed ^
// kLoraSeedSalt), so values do not depend on the layout; element j takes the
// stream's draws from 2j (normal) or j (uniform), so that threads fill
// blocks of a tensor at once.
constexpr uint64_t kLoraSeedSalt = 0x4c6f5241'00000000ull;
void init_tensor(const GPTConfig& cfg, const ParamSpec& spec, uint64_t seed, float* out);
// Rows [row0, row0 + nrows) of the same tensor into out[0, nrows *
// row_floats(spec)): the values init_tensor puts there.
void init_tensor_rows(const GPTConfig& cfg, const ParamSpec& spec, uint64_t seed, int64_t row0,
                      int64_t nrows, float* out);

// ---- for_each_part_run ------------------------------------------------------------

template <typename Fn>
void for_each_part_run(const ParamSpec& s, int64_t row0, int64_t nrows, int r, int tp, Fn&& fn) {
  const size_t rf = row_floats(s), first = static_cast<size_t>(row0) * rf,
               last = first + static_cast<size_t>(nrows) * rf;
  if (s.tp_dim < 0 || tp == 1) {
    if (last > first) fn(size_t{0}, first, last - first);
    return;
  }
  // The logical tensor as (outer, D, inner), D = full_shape[tp_dim] made of
  // tp_parts parts: rank r holds piece r of every part of every outer row,
  // one run of piece * inner elements each.
  const Shape& f = s.full_shape;
  size_t outer = 1, inner = 1;
  for (int d = 0; d < s.tp_dim; ++d) outer *= static_cast<size_t>(f.dims[d]);
  for (int d = s.tp_dim + 1; d < f.ndim; ++d) inner *= static_cast<size_t>(f.dims[d]);
  const size_t D = static_cast<size_t>(f.dims[s.tp_dim]), per_part = D / s.tp_parts,
               piece = per_part / tp, run = piece * inner;
  const size_t o0 = first / (D * inner), o1 = std::min(outer, (last + D * inner - 1) / (D * inner));
  for (size_t o = o0; o < o1; ++o) {
    for (int p = 0; p < s.tp_parts; ++p) {
      const size_t a = (o * D + p * per_part + r * piece) * inner;  // in the logical tensor
      const size_t b = (o * (D / tp) + p * piece) * inner;          // in the part
      const size_t lo = std::max(a, first), hi = std::min(a + run, last);
      if (lo < hi) fn(lo - first, b + (lo - a), hi - lo);
    }
  }
}

}  // namespace meshlm
