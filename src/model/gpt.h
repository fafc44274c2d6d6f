// GPT-2 on the CPU backend: the parameter table, the flat parameter and
// gradient buffers, and the forward/backward pass of one micro-batch.
//
// The parameters are ONE allocation plus a table (name, shape, offset, the
// dimension tensor parallelism splits). Gradients use the same table on a
// second buffer of the same size; optimizer state, checkpoint datasets and
// LoRA adapters are derived from the same table. Nothing keeps a second list
// of tensor names.
//
// Names follow the Hugging Face GPT-2 checkpoint (wte.weight, h.0.attn.c_attn.
// weight, ...) so that imported weights map by name, but linear weights are
// stored (out, in) like torch.nn.Linear (HF's Conv1D stores them transposed).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/tensor.h"
#include "model/config.h"

namespace meshlm {

struct ParamSpec {
  std::string name;  // also the HDF5 dataset name under /params
  Shape shape;
  size_t offset = 0;  // in elements, into the flat buffer
  int tp_dim = -1;    // dimension split by tensor parallelism; -1 = replicated
  int layer = -1;     // transformer block, -1 for embeddings and final norm
  bool decay() const { return shape.ndim >= 2; }  // AdamW decays matrices only
  size_t numel() const { return static_cast<size_t>(shape.numel()); }
  // This tensor inside a flat fp32 buffer laid out by the table.
  TensorView in(float* base) const { return {base + offset, shape, DType::f32, Device::cpu}; }
};

// The table, in memory order: wte, wpe, blocks 0..L-1, ln_f.
std::vector<ParamSpec> gpt_param_table(const GPTConfig& cfg);
size_t table_numel(const std::vector<ParamSpec>& table);

// Pointers into a flat buffer laid out by the table. Shapes per tensor:
struct BlockTensors {
  float* ln1w;      // (C)
  float* ln1b;      // (C)
  float* qkvw;      // (3C, C)
  float* qkvb;      // (3C)
  float* attprojw;  // (C, C)
  float* attprojb;  // (C)
  float* ln2w;      // (C)
  float* ln2b;      // (C)
  float* fcw;       // (4C, C)
  float* fcb;       // (4C)
  float* fcprojw;   // (C, 4C)
  float* fcprojb;   // (C)
};
struct GPTTensors {
  float* wte;  // (Vp, C)
  float* wpe;  // (maxT, C)
  std::vector<BlockTensors> blocks;  // L
  float* lnfw;  // (C)
  float* lnfb;  // (C)
};

class GPT {
public:
  explicit GPT(const GPTConfig& cfg);

  const GPTConfig& config() const { return cfg_; }
  const std::vector<ParamSpec>& table() const { return table_; }
  size_t num_params() const { return num_params_; }
  float* params() { return params_.as<float>(); }
  float* grads() { return grads_.as<float>(); }
  const float* params() const { return params_.as<float>(); }
  const float* grads() const { return grads_.as<float>(); }
  // One tensor of the table by name; throws RankError for an unknown name.
  const ParamSpec& spec(const std::string& name) const;
  std::span<float> param(const std::string& name) { return view(params(), name); }
  std::span<float> grad(const std::string& name) { return view(grads(), name); }

  // GPT-2 initialisation: N(0, 0.02) for matrices, residual projections
  // (c_proj) scaled by 1/sqrt(2L), zero biases, unit LayerNorm gains, zero
  // padded vocabulary rows. Each tensor has its own stream seeded from
  // (seed, tensor index), so values do not depend on the memory layout.
  void init_weights(uint64_t seed);

  // Forward of one micro-batch tokens(B,T) -> mean cross-entropy against
  // targets(B,T). Activations are kept for backward; they are (re)allocated
  // when (B, T) changes.
  float forward(const int32_t* tokens, const int32_t* targets, int B, int Tn);
  // Backward of the last forward: grads += d(loss_scale * mean loss)/dparams.
  void backward(float loss_scale = 1.0f);
  void zero_grads();

  // Bytes of activations kept for one micro-batch of (B, T) (for the planner).
  static size_t activation_bytes(const GPTConfig& cfg, int B, int Tn);

private:
  std::span<float> view(float* base, const std::string& name) const;
  GPTTensors tensors(float* base) const;
  void ensure_activations(int B, int Tn);

  GPTConfig cfg_;
  std::vector<ParamSpec> table_;
  size_t num_params_ = 0;
  Buffer params_, grads_;

  // Activations of the last forward, one flat buffer cut by acts_ below.
  int B_ = 0, T_ = 0;
  bool have_forward_ = false;
  Buffer act_buf_, grad_act_buf_;
  struct BlockActs {
    float* ln1;       // (B,T,C)
    float* ln1_mean;  // (B,T)
    float* ln1_rstd;  // (B,T)
    float* qkv;       // (B,T,3C)
    float* atty;      // (B,T,C)
    float* att;       // (B,NH,T,T)
    float* attproj;   // (B,T,C)
    float* res2;      // (B,T,C) residual after attention
    float* ln2;       // (B,T,C)
    float* ln2_mean;  // (B,T)
    float* ln2_rstd;  // (B,T)
    float* fch;       // (B,T,4C)
    float* fch_gelu;  // (B,T,4C)
    float* fcproj;    // (B,T,C)
    float* res3;      // (B,T,C) residual after the MLP = block output
  };
  struct Acts {
    float* encoded;  // (B,T,C)
    std::vector<BlockActs> blocks;
    float* lnf;       // (B,T,C)
    float* lnf_mean;  // (B,T)
    float* lnf_rstd;  // (B,T)
    float* probs;     // (B,T,Vp) logits, then probabilities, then dlogits
    float* losses;    // (B,T)
  } acts_{};
  // Gradient scratch for one block at a time (backward walks the blocks).
  struct GradActs {
    float* dres;      // (B,T,C) gradient of the residual stream
    float* dln;       // (B,T,C)
    float* dqkv;      // (B,T,3C)
    float* datty;     // (B,T,C)
    float* datt;      // (B,NH,T,T)
    float* dfch;      // (B,T,4C)
    float* dfch_gelu; // (B,T,4C)
    float* dlosses;   // (B,T)
  } gacts_{};
  std::vector<int32_t> tokens_, targets_;  // copies of the last micro-batch
};

}  // namespace meshlm
