// GPT-2, or a Llama-family model (model.arch), on either backend
// (ops::Kernels): one rank's shard of the model (its pipeline
// stage's layers, each split tensor cut to its tensor-parallel part), its
// flat parameter and gradient buffers laid out by the parameter table
// (model/param_table.h), and the forward/backward of that shard for one
// micro-batch in one activation slot (model/activations.h).
//
// The code of the class is cut by concern: gpt.cpp builds the shard (its
// table, buffers, weights, the frozen base under LoRA), gpt_forward.cpp is
// the block and stage forward and backward, gpt_linear.cpp the dispatch of a
// linear layer (fp32, quantized base, LoRA adapter).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "model/activations.h"
#include "model/gpt_config.h"
#include "model/gpt_options.h"
#include "model/lora.h"
#include "model/param_table.h"
#include "model/tp_region.h"
#include "ops/kernels.h"
#include "quant/dequantizer.h"
#include "quant/qlinear.h"

namespace meshlm {

namespace comm {
class Communicator;
}

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
  // Llama (ln1w and ln2w are its RMSNorm gains; no biases):
  float* qw;        // (Cl, C)     column-parallel
  float* kw;        // (Ckvl, C)   column-parallel
  float* vw;        // (Ckvl, C)
  float* ow;        // (C, Cl)     row-parallel
  float* gatew;     // (Fl, C)     column-parallel
  float* upw;       // (Fl, C)
  float* downw;     // (C, Fl)     row-parallel
};
struct GPTTensors {
  float* wte = nullptr;  // (Vl, C)   vocabulary-parallel; null where the stage has no wte
  float* wpe = nullptr;  // (maxT, C) first stage only (GPT-2)
  std::vector<BlockTensors> blocks;  // the stage's layers
  float* lnfw = nullptr;  // (C) last stage only
  float* lnfb = nullptr;  // (C) (GPT-2)
  float* cls = nullptr;   // (Vl, C)   the classifier's weight: wte, or Llama's untied lm_head
};

// What a rank trains: the base table (full training) or the adapters (LoRA).
std::vector<ParamSpec> trainable_table(const GPTConfig& cfg, const ModelShard& shard,
                                       const GPTOptions& opts);
// The same without a copy, kept for the next call as shared_param_table keeps
// the model's tables.
std::shared_ptr<const std::vector<ParamSpec>> shared_trainable_table(const GPTConfig& cfg,
                                                                     const ModelShard& shard,
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
  // The backend the shard computes on; params(), grads() and the activations
  // are in its memory (kernels().device()).
  const ops::Kernels& kernels() const { return *k_; }
  // The trained parameters (num_params()) copied to the host.
  std::vector<float> host_params() const;
  const std::vector<ParamSpec>& table() const { return table_; }
  size_t num_params() const { return num_params_; }      // elements of this shard
  size_t padded_params() const { return padded_params_; }  // flat buffer length
  float* params() { return params_.as<float>(); }
  float* grads() { return grads_.as<float>(); }
  const float* params() const { return params_.as<float>(); }
  const float* grads() const { return grads_.as<float>(); }
  // One tensor of the table by its file name (for tools and tests; the
  // model itself finds tensors by role); throws RankError for an unknown name.
  const ParamSpec& spec(const std::string& name) const;
  std::span<float> param(const std::string& name) { return view(params(), name); }
  std::span<float> grad(const std::string& name) { return view(grads(), name); }

  // Initialises the trainable tensors by their InitKind (init_tensor): GPT-2's
  // initialisation in full training, the adapters' under LoRA. Each logical
  // tensor has its own stream seeded from (seed, its index in the whole
  // model's table), and a shard takes its part of it: values do not depend
  // on the layout.
  void init_weights(uint64_t seed);
  // Sets every trained tensor from value_of(spec, row0, nrows, out), which
  // writes rows [row0, row0 + nrows) of the logical tensor (spec.full_shape;
  // row_floats(spec) elements a row) to out; this rank keeps its part. A
  // tensor written straight into place (unsplit, on the CPU) is asked for
  // whole; any other a block of rows at a time, in one buffer of at most
  // kWeightBlockBytes (or one row; booked as workspace).
  using RowsOf = std::function<void(const ParamSpec&, int64_t row0, int64_t nrows, float* out)>;
  void set_weights(const RowsOf& value_of);
  static constexpr size_t kWeightBlockBytes = size_t{4} << 20;
  // The workspace set_weights takes for `table` (a rank's trained tensors):
  // the largest block of a tensor that is split (tp_size > 1) or, off the
  // CPU (host = false), of any tensor.
  static size_t weight_block_bytes(const std::vector<ParamSpec>& table, int tp_size, bool host);

  // ---- LoRA: the frozen base -------------------------------------------------
  bool lora() const { return opts_.lora.enabled; }
  // The base tensors of this shard (the whole model's table cut to the shard),
  // whatever is trained.
  const std::vector<ParamSpec>& base_table() const { return base_table_; }
  // Under LoRA: `tensor_of(spec)` gives the quantized logical tensor of each
  // base table entry (spec.full_shape), in host memory. On the CPU, matrices
  // are used in place, never copied (zero copy from a node-shared window);
  // on a GPU, the matrices of this stage are uploaded once, still quantized,
  // into one device buffer (booked as quantized). Vectors (biases,
  // LayerNorm) are copied into this rank's part (frozen, booked as params).
  void attach_base(const std::function<quant::QTensor(const ParamSpec&)>& tensor_of);
  // Elements of the frozen vectors a shard keeps (planner).
  static size_t frozen_numel(const GPTConfig& cfg, const ModelShard& shard);
  // Bytes of the shard's quantized matrices in format `type`, each laid out
  // as in the host store: what attach_base() uploads to a GPU (category
  // quantized); the frozen vectors are dequantized into frozen_numel() floats.
  static size_t quantized_matrix_bytes(const GPTConfig& cfg, const ModelShard& shard,
                                       quant::QuantType type);

  // ---- one pipeline stage, one micro-batch in activation slot `slot` -------
  // Forward. First stage: reads tokens(B,T); other stages: their input
  // (B,T,C) must be in stage_input(slot). Last stage: returns the mean
  // cross-entropy against targets(B,T); other stages leave their output
  // (B,T,C) in stage_output(slot) and return 0. The classifier computes its
  // logits a chunk of rows at a time (model/activations.h), so the (B,T,V)
  // logits never exist. With head_grad_scale (training), the last stage
  // also runs the classifier's backward at that loss scale, chunk by chunk
  // while each chunk's logits are at hand, accumulating wte's gradient now;
  // backward(slot) must then follow at the same scale. Without it,
  // backward() recomputes the logits: the same bits, one more GEMM.
  float forward(int slot, const int32_t* tokens, const int32_t* targets, int B, int Tn,
                std::optional<float> head_grad_scale = std::nullopt);
  // The same, but the last stage keeps the mean loss on the backend as
  // micro-batch `micro`'s (micro < options().micro_batches) instead of
  // waiting for it: a step reads all of them with one queued_losses().
  void forward_queued(int slot, int micro, const int32_t* tokens, const int32_t* targets, int B,
                      int Tn, std::optional<float> head_grad_scale = std::nullopt);
  // Last stage: the mean losses of micro-batches [0, n) that forward_queued
  // left, as forward() returns them (one wait for the backend).
  std::vector<float> queued_losses(int n) const;
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
  // block_done(l) as above, the gradients staying in the model's buffer
  // (ZeRO 0/1's reductions during the backward).
  void on_block_done(std::function<void(int layer)> block_done) {
    block_done_ = std::move(block_done);
  }
  // The token embedding's gradient in blocks of rows of this rank's
  // vocabulary part, never whole (ZeRO 2): `rows` rows at a time (at most
  // wte_grad_rows() for the micro-batch's tokens) land in `buffer` (rows * C
  // floats, zeroed first by the model), then done(r0, n) is called for rows
  // [r0, r0 + n). The classifier's contribution comes after its row chunks
  // (each block's logits made again from the softmax's kept reductions: one
  // more GEMM the size of the classifier's), the lookup's at the end of
  // backward. Needs set_grad_target() first.
  void set_wte_grad_blocks(float* buffer, int rows, std::function<void(int r0, int n)> done);
  // Tensor-parallel communication time is booked under Section::tp_comm here.
  void set_timers(SectionTimers* t) { tp_.set_timers(t); }

  // Bytes of activations this shard keeps for micro-batches of (B, T) (for
  // the planner); equals what ensure_activations() allocates.
  static size_t activation_bytes(const GPTConfig& cfg, const ModelShard& shard,
                                 const GPTOptions& opts, int B, int Tn) {
    return meshlm::activation_bytes(cfg, shard, opts, B, Tn);
  }
  static size_t activation_bytes(const GPTConfig& cfg, int B, int Tn) {
    return meshlm::activation_bytes(cfg, {}, {}, B, Tn);
  }

private:
  std::span<float> view(float* base, const std::string& name) const;
  GPTTensors tensors(float* base) const;
  BlockTensors block_tensors(int local_layer, const std::function<float*(size_t)>& at) const;
  void block_forward(int l, const BlockTensors& w, BlockActs& a, const float* x, int B, int Tn);
  // Llama's block (model/llama_block.cpp): RMSNorm, q, k, v with the rotary
  // embeddings and grouped-query heads, o; RMSNorm, SwiGLU's gate, up and down.
  void llama_block_forward(int l, const BlockTensors& w, BlockActs& a, const float* x, int B,
                           int Tn);
  void llama_block_backward(int l, const BlockTensors& w, const BlockTensors& gw, BlockActs& a,
                            const float* x, int B, int Tn);
  void gpt2_block_backward(int l, const BlockTensors& w, const BlockTensors& gw, BlockActs& a,
                           const float* x, int B, int Tn);
  // The rotary tables of positions [0, Tn) into gacts_ (Llama).
  void fill_rope_tables(int Tn);
  // One linear layer `slot` of local block l with its fp32 weight w or its
  // frozen quantized base, plus its adapter when there is one.
  void linear_forward(int l, LinearSlot slot, float* out, const float* inp, const float* w,
                      const float* bias, int N, int IC, int OC);
  void linear_backward(int l, LinearSlot slot, float* dinp, float* dw, float* dbias,
                       const float* dout, const float* inp, const float* w, int N, int IC, int OC);
  const quant::QSlice* qbase(size_t base_index) const;
  std::optional<quant::QAdapter> merged_adapter(int l, LinearSlot slot) const;
  void classifier_tile();
  const float* classifier_weight(const GPTTensors& p) const;
  void head_logits(const SlotActs& s, const GPTTensors& p, int r0, int nr);
  void head_backward_rows(SlotActs& s, const GPTTensors& p, int r0, int nr);
  void head_dlogits_backward(SlotActs& s, const GPTTensors& p, int r0, int nr);
  template <typename F>
  void for_each_wte_grad_block(int N, F make);
  void head_wte_grad_blocks(const SlotActs& s, const GPTTensors& p, int N);
  void embedding_grad_blocks(const SlotActs& s, int N);
  float* grad_at(size_t index);
  // Whether the classifier's weight gradient is made in wte's blocks
  // (set_wte_grad_blocks, and the classifier is wte).
  bool cls_in_blocks() const { return wte_block_ != nullptr && cfg_.tied_classifier(); }

  GPTConfig cfg_;
  ModelShard shard_;
  GPTOptions opts_;
  const ops::Kernels* k_;            // opts_.kernels, or the CPU backend
  const quant::Dequantizer* dq_;     // opts_.dequantizer, or the CPU reference
  TPRegion tp_;
  int n_local_ = 0;  // layers of this stage
  // base_table_ indices, found by role: the tensors outside the blocks (-1
  // where the stage has none), each local block's [begin, end) and its
  // linear weights per slot.
  int idx_wte_ = -1, idx_wpe_ = -1, idx_lnfw_ = -1, idx_lnfb_ = -1, idx_lm_head_ = -1;
  int idx_cls_ = -1;  // the classifier's weight: idx_wte_, or Llama's untied lm_head
  bool llama_ = false;
  std::vector<std::pair<size_t, size_t>> block_range_;
  std::vector<std::array<size_t, kLinearSlots>> linear_index_;
  std::vector<ParamSpec> table_;       // trained: base_table_ (full) or the adapters (LoRA)
  std::vector<ParamSpec> base_table_;  // the shard's base tensors
  size_t num_params_ = 0, padded_params_ = 0;
  Buffer params_, grads_;
  // LoRA: frozen base matrices (per base_table_ index; empty slices, R = 0,
  // for vectors) and vectors (frozen_, at frozen_offset_ per base index).
  std::vector<quant::QSlice> qbase_;
  Buffer qdevice_;  // on a GPU: the matrices' quantized bytes, uploaded once (qbase_ points here)
  Buffer frozen_;
  std::vector<size_t> frozen_offset_;
  // Under LoRA, per local block and slot: table_ indices of A and B, or -1.
  struct AdapterIndex {
    int a = -1, b = -1;
  };
  std::vector<std::array<AdapterIndex, kLinearSlots>> adapter_;
  std::function<float*(size_t)> grad_where_;
  std::function<void(int)> block_done_;
  float* wte_block_ = nullptr;  // set_wte_grad_blocks: null = wte's gradient whole at grad_at
  int wte_block_rows_ = 0;
  std::function<void(int, int)> wte_block_done_;

  int B_ = 0, T_ = 0;
  Buffer act_buf_, grad_act_buf_;
  std::vector<SlotActs> slots_;
  GradActs gacts_{};
};

}  // namespace meshlm
