// GPT-2 on the CPU backend: the parameter table, the flat parameter and
// gradient buffers, and the forward/backward pass of one pipeline stage's
// share of the model for one micro-batch.
//
// The parameters are ONE allocation plus a table (name, shape, offset, the
// dimension tensor parallelism splits). Gradients use the same table on a
// second buffer of the same size; optimizer state, ZeRO shards, checkpoint
// datasets and LoRA adapters are derived from the same table. Nothing keeps a
// second list of tensor names.
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

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/enum_names.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "model/gpt_config.h"
#include "model/lora.h"
#include "model/tp_region.h"
#include "quant/qlinear.h"

namespace meshlm {

namespace comm {
class Communicator;
}

struct ParamSpec {
  std::string name;  // also the HDF5 dataset name under /params
  Shape shape;       // this rank's part (== full_shape without tensor parallelism)
  size_t offset = 0;  // in elements, into the flat buffer
  int tp_dim = -1;    // dimension split by tensor parallelism; -1 = replicated
  int layer = -1;     // transformer block, -1 for embeddings and final norm
  Shape full_shape;   // the logical tensor
  int tp_parts = 1;   // tp_dim is made of this many equal parts (q, k, v), each split
  int index = 0;      // position in the table of the whole model (seeds its init stream)
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
};

// Builds a table in memory order for one shard: add() is called for every
// tensor of the whole model, in order (its position is the tensor's index);
// those the shard keeps get their local shape (tp_dim divided by tp_size)
// and the next offset.
class TableBuilder {
public:
  explicit TableBuilder(int tp_size) : tp_(tp_size) {}
  void add(std::string name, Shape full, int tp_dim, int parts, int layer, bool keep);
  std::vector<ParamSpec> take() { return std::move(table_); }

private:
  int tp_ = 1, index_ = 0;
  size_t offset_ = 0;
  std::vector<ParamSpec> table_;
};

// The table, in memory order: wte (first or last stage), wpe (first stage),
// the stage's blocks, ln_f (last stage). Without a shard: the whole model.
std::vector<ParamSpec> gpt_param_table(const GPTConfig& cfg, const ModelShard& shard = {});
size_t table_numel(const std::vector<ParamSpec>& table);

// Copies between a logical tensor (spec.full_shape, row-major) and this
// rank's part of it (spec.shape) for tensor-parallel rank tp_rank of tp_size.
void shard_from_full(const ParamSpec& spec, const float* full, float* part, int tp_rank,
                     int tp_size);
void shard_to_full(const ParamSpec& spec, const float* part, float* full, int tp_rank,
                   int tp_size);

// The GPT-2 initial value of the logical tensor `spec` (full_shape, written
// whole to `out`): N(0, 0.02) for matrices, residual projections (c_proj)
// scaled by 1/sqrt(2L), zero biases, unit LayerNorm gains, zero padded
// vocabulary rows. Each tensor has its own stream seeded from (seed,
// spec.index), so values do not depend on the layout.
void gpt_init_tensor(const GPTConfig& cfg, const ParamSpec& spec, uint64_t seed, float* out);

// Pointers into a flat buffer laid out by the table. Local shapes per tensor
// (Cl = C / tp, Fl = 4C / tp, Vl = Vp / tp):
struct BlockTensors {
  float* ln1w;      // (C)
  float* ln1b;      // (C)
  float* qkvw;      // (3Cl, C)   column-parallel: rows of q, k and v of this rank's heads
  float* qkvb;      // (3Cl)
  float* attprojw;  // (C, Cl)    row-parallel
  float* attprojb;  // (C)
  float* ln2w;      // (C)
  float* ln2b;      // (C)
  float* fcw;       // (Fl, C)    column-parallel
  float* fcb;       // (Fl)
  float* fcprojw;   // (C, Fl)    row-parallel
  float* fcprojb;   // (C)
};
struct GPTTensors {
  float* wte = nullptr;  // (Vl, C)   vocabulary-parallel; null where the stage has no wte
  float* wpe = nullptr;  // (maxT, C) first stage only
  std::vector<BlockTensors> blocks;  // the stage's layers
  float* lnfw = nullptr;  // (C) last stage only
  float* lnfb = nullptr;  // (C)
};

// parallel.activation_checkpointing: what a pipeline slot keeps of a block.
enum class Checkpointing {
  none,  // every activation of every block
  full,  // each block's output only; backward recomputes the block
};
inline constexpr EnumName<Checkpointing> kCheckpointingNames[] = {
    {Checkpointing::none, "none"},
    {Checkpointing::full, "full"},
};
constexpr std::span<const EnumName<Checkpointing>> enum_names(Checkpointing) {
  return kCheckpointingNames;
}

struct GPTOptions {
  int slots = 1;  // micro-batches whose activations are kept at once (pipeline in-flight)
  Checkpointing checkpointing = Checkpointing::none;
  size_t pad_multiple = 1;  // flat buffers padded to a multiple of this (ZeRO shards)
  bool own_grads = true;    // false: gradients go where set_grad_target() says (ZeRO-2)
  LoraOptions lora;         // enabled: the base is frozen (attach_base) and only adapters train
};

// What a rank trains: the base table (full training) or the adapters (LoRA).
std::vector<ParamSpec> trainable_table(const GPTConfig& cfg, const ModelShard& shard,
                                       const GPTOptions& opts);

class GPT {
public:
  // `tp` is the tensor-parallel group (null when tp_size == 1); it must
  // outlive the model. Every forward/backward is collective over it.
  explicit GPT(const GPTConfig& cfg, const ModelShard& shard = {}, const GPTOptions& opts = {},
               comm::Communicator* tp = nullptr);

  const GPTConfig& config() const { return cfg_; }
  const ModelShard& shard() const { return shard_; }
  const GPTOptions& options() const { return opts_; }
  const std::vector<ParamSpec>& table() const { return table_; }
  size_t num_params() const { return num_params_; }      // elements of this shard
  size_t padded_params() const { return padded_params_; }  // flat buffer length
  float* params() { return params_.as<float>(); }
  float* grads() { return grads_.as<float>(); }
  const float* params() const { return params_.as<float>(); }
  const float* grads() const { return grads_.as<float>(); }
  // One tensor of the table by name; throws RankError for an unknown name.
  const ParamSpec& spec(const std::string& name) const;
  bool has(const std::string& name) const;
  std::span<float> param(const std::string& name) { return view(params(), name); }
  std::span<float> grad(const std::string& name) { return view(grads(), name); }

  // Initialises the trainable tensors: GPT-2's initialisation
  // (gpt_init_tensor) in full training, the adapters' (lora_init_tensor)
  // under LoRA. Each logical tensor has its own stream seeded from (seed, its
  // index in the whole model's table), and a shard takes its part of it:
  // values do not depend on the layout.
  void init_weights(uint64_t seed);
  // Sets every trained tensor from value_of(spec, out), which writes the
  // logical tensor (spec.full_shape) whole; this rank keeps its part. One
  // logical tensor at a time is held whole (booked as workspace).
  void set_weights(const std::function<void(const ParamSpec&, float*)>& value_of);

  // ---- LoRA: the frozen base -------------------------------------------------
  bool lora() const { return opts_.lora.enabled; }
  // The base tensors of this shard (the whole model's table cut to the shard),
  // whatever is trained.
  const std::vector<ParamSpec>& base_table() const { return base_table_; }
  // Under LoRA: `tensor_of(spec)` gives the quantized logical tensor of each
  // base table entry (spec.full_shape). Matrices are used in place, never
  // copied (zero copy from a node-shared window); vectors (biases, LayerNorm)
  // are copied into this rank's part (frozen, booked as params).
  void attach_base(const std::function<quant::QTensor(const ParamSpec&)>& tensor_of);
  // Elements of the frozen vectors a shard keeps (planner).
  static size_t frozen_numel(const GPTConfig& cfg, const ModelShard& shard);

  // ---- one pipeline stage, one micro-batch in activation slot `slot` -------
  // Forward. First stage: reads tokens(B,T); other stages: their input
  // (B,T,C) must be in stage_input(slot). Last stage: returns the mean
  // cross-entropy against targets(B,T); other stages leave their output
  // (B,T,C) in stage_output(slot) and return 0.
  float forward(int slot, const int32_t* tokens, const int32_t* targets, int B, int Tn);
  // Backward of slot's forward. Last stage: of loss_scale * mean loss; other
  // stages: of <grad_stream(), output> (put d loss / d output in
  // grad_stream() first). Parameter gradients are accumulated (+=); on a
  // stage other than the first, grad_stream() holds d loss / d input after.
  void backward(int slot, float loss_scale = 1.0f);
  float* stage_input(int slot);
  const float* stage_output(int slot) const;
  float* grad_stream() { return gacts_.dres; }  // (B,T,C)
  // Sizes the activation slots for (B, T) (done by forward too).
  void ensure_activations(int B, int Tn);

  // The whole model on one rank: forward + backward of slot 0.
  float forward(const int32_t* tokens, const int32_t* targets, int B, int Tn) {
    return forward(0, tokens, targets, B, Tn);
  }
  void backward(float loss_scale = 1.0f) { backward(0, loss_scale); }
  void zero_grads();

  // Gradients elsewhere (own_grads = false): where(i) is the gradient buffer
  // of table entry i; block_done(l) is called when backward has finished
  // accumulating block l's gradients of one micro-batch (so a bucket for one
  // block at a time is enough).
  void set_grad_target(std::function<float*(size_t index)> where,
                       std::function<void(int layer)> block_done);
  // Tensor-parallel communication time is booked under Section::tp_comm here.
  void set_timers(SectionTimers* t) { tp_.set_timers(t); }

  // Bytes of activations this shard keeps for micro-batches of (B, T) (for
  // the planner); equals what ensure_activations() allocates.
  static size_t activation_bytes(const GPTConfig& cfg, const ModelShard& shard,
                                 const GPTOptions& opts, int B, int Tn);
  static size_t activation_bytes(const GPTConfig& cfg, int B, int Tn) {
    return activation_bytes(cfg, {}, {}, B, Tn);
  }

private:
  struct BlockActs {
    float* ln1;       // (B,T,C)
    float* ln1_mean;  // (B,T)
    float* ln1_rstd;  // (B,T)
    float* qkv;       // (B,T,3Cl)
    float* atty;      // (B,T,Cl)
    float* att;       // (B,NHl,T,T)
    float* attproj;   // (B,T,C)
    float* res2;      // (B,T,C) residual after attention
    float* ln2;       // (B,T,C)
    float* ln2_mean;  // (B,T)
    float* ln2_rstd;  // (B,T)
    float* fch;       // (B,T,Fl)
    float* fch_gelu;  // (B,T,Fl)
    float* fcproj;    // (B,T,C)
    float* res3;      // (B,T,C) residual after the MLP = block output
  };
  // The activations of one micro-batch. With checkpointing, only input and
  // every block's res3 are per slot; the other block arrays point into one
  // shared block (recompute_) refilled by the block's forward in backward.
  struct SlotActs {
    float* input;  // (B,T,C) embedding output, or the activations received
    std::vector<BlockActs> blocks;
    float* lnf;        // (B,T,C)
    float* lnf_mean;   // (B,T)
    float* lnf_rstd;   // (B,T)
    float* logits;     // (B,T,Vl) logits, then dlogits in backward
    float* losses;     // (B,T)
    float* xent_max;   // (B,T) row max over the whole vocabulary
    float* xent_sums;  // (B,T,2) sum exp(l - max), target logit
    std::vector<int32_t> tokens, targets;
    bool forwarded = false;
  };
  struct GradActs {
    float* dres;       // (B,T,C) gradient of the residual stream
    float* dln;        // (B,T,C)
    float* dqkv;       // (B,T,3Cl)
    float* datty;      // (B,T,Cl)
    float* datt;       // (B,NHl,T,T)
    float* dfch;       // (B,T,Fl)
    float* dfch_gelu;  // (B,T,Fl)
    float* dlosses;    // (B,T)
    // LoRA / quantized base scratch (null in full training)
    float* lora_u;     // (B*T, r)
    float* lora_du;    // (B*T, r)
    float* lora_tmp;   // (r*C) a replicated adapter's partial gradient, summed over TP
    float* qtile;      // (kQLinearTileRows, max(C, Fl)) dequantized rows of a frozen matrix
    float* wpe_rows;   // (T, C) dequantized positions (first stage)
  };
  struct ActLayout;
  static ActLayout plan_activations(const GPTConfig& cfg, const ModelShard& shard,
                                    const GPTOptions& opts, int B, int Tn);

  std::span<float> view(float* base, const std::string& name) const;
  GPTTensors tensors(float* base) const;
  BlockTensors block_tensors(int local_layer, const std::function<float*(size_t)>& at) const;
  void block_forward(int l, const BlockTensors& w, BlockActs& a, const float* x, int B, int Tn);
  // One linear layer of local block l: target t (0 qkv, 1 attn-out, 2 mlp-up,
  // 3 mlp-down; lora.h) with its fp32 weight w or its frozen quantized base,
  // plus its adapter when there is one.
  void linear_forward(int l, int t, float* out, const float* inp, const float* w,
                      const float* bias, int N, int IC, int OC);
  void linear_backward(int l, int t, float* dinp, float* dw, float* dbias, const float* dout,
                       const float* inp, const float* w, int N, int IC, int OC);
  const quant::QSlice* qbase(size_t base_index) const;
  float* grad_at(size_t index);

  GPTConfig cfg_;
  ModelShard shard_;
  GPTOptions opts_;
  TPRegion tp_;
  int n_local_ = 0;           // layers of this stage
  size_t first_block_ = 0;    // table index of the stage's first block tensor
  int idx_wte_ = -1, idx_wpe_ = -1, idx_lnf_ = -1;
  std::vector<ParamSpec> table_;       // trained: base_table_ (full) or the adapters (LoRA)
  std::vector<ParamSpec> base_table_;  // the shard's base tensors
  size_t num_params_ = 0, padded_params_ = 0;
  Buffer params_, grads_;
  // LoRA: frozen base matrices (per base_table_ index; empty slices, R = 0,
  // for vectors) and vectors (frozen_, at frozen_offset_ per base index).
  std::vector<quant::QSlice> qbase_;
  Buffer frozen_;
  std::vector<size_t> frozen_offset_;
  std::vector<std::array<int, kLinearSlots>> lora_index_;  // per local block: table_ index of A, or -1
  std::function<float*(size_t)> grad_where_;
  std::function<void(int)> block_done_;

  int B_ = 0, T_ = 0;
  Buffer act_buf_, grad_act_buf_;
  std::vector<SlotActs> slots_;
  BlockActs recompute_{};
  GradActs gacts_{};
};

}  // namespace meshlm
