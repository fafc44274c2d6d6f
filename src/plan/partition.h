// Splitting the L transformer layers into p pipeline stages.
//
// Stage k holds a contiguous run of n_k >= 1 layers, sum n_k = L. Its cost per
// micro-batch token is
//   cost_k = n_k * layer + (k == 0 ? embedding : 0) + (k == p-1 ? head : 0)
// and the pipeline runs at the pace of its slowest stage, so the partition
// minimises max_k cost_k. With GPT-2 the head (lm_head over Vp columns and
// the loss) costs about Vp / (12 C + 2 T) layers, 4.5 for GPT-2 124M at
// T = 1024: an even split would leave the last stage the slowest by far.
//
// parallel.stage_layers = "3,3,2,2" overrides the computed split.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/gpt_config.h"

namespace meshlm {

// Relative costs; only their ratios matter to balance_stages.
struct StageCosts {
  double layer = 1;      // one transformer block
  double embedding = 0;  // wte/wpe lookup and add, on the first stage
  double head = 0;       // final layernorm, lm_head and loss, on the last stage
};

// FLOPs of one training token (forward + backward = 3x forward: the backward
// of a matmul is two matmuls of the same size), C = n_embd, T = seq_len,
// Vp = padded vocabulary:
//   layer     = 3 (2 P + 4 T C)       P = the block's linear weights (2 flops per
//                                     multiply-add; GPT-2 12 C^2: QKV 3, proj 1,
//                                     MLP 8; Llama 2 C^2 + 2 C Ckv + 3 C F:
//                                     GPTConfig::block_matmul_elements); scores
//                                     QK^T 2TC, att V 2TC
//   embedding = 3 C                   lookup + add of the embedding rows
//   head      = 3 (2 C Vp) + 3 (5 Vp) lm_head matmul; softmax cross-entropy
// Layernorms, GELU and residual adds are left out: O(C) against O(C^2). The
// attention term counts the full T x T product although it is causal, as
// the usual 6N + 12LTC estimate does.
StageCosts gpt_stage_costs(const GPTConfig& cfg, int seq_len);

// Layers per stage (size num_stages, each >= 1, sum n_layer) minimising the
// largest stage cost; among those, the sum of squared stage costs (the most
// even split: 10 equal layers over 4 stages give 3,3,2,2, not 3,3,3,1);
// remaining ties go to the lexicographically largest (most layers on the
// earliest stages), so every rank computes the same split. Exact: two
// O(p L^2) dynamic programs. CollectiveError naming parallel.pp and
// model.n_layer when num_stages < 1 or num_stages > n_layer.
//
// `fits` (when given): whether stage k may hold n layers (its memory); the
// split then minimises the largest cost among those where every stage fits,
// and is empty when none does. Asked once per (k, n).
using StageFits = std::function<bool(int stage, int layers)>;
std::vector<int> balance_stages(int n_layer, int num_stages, const StageCosts& costs,
                                const StageFits& fits = {});

// Parses parallel.stage_layers, e.g. "3,3,2,2" (spaces allowed). CollectiveError
// naming parallel.stage_layers and the text when it is empty or malformed, an
// entry is < 1, the count differs from num_stages (parallel.pp) or the sum
// from n_layer (model.n_layer).
std::vector<int> parse_stage_layers(const std::string& text, int n_layer, int num_stages);
// The two halves of parse_stage_layers: the syntax of the list (false and
// `why` when it is malformed; an empty text is an empty list), and its
// count and sum against parallel.pp and model.n_layer (CollectiveError).
bool parse_layer_list(const std::string& text, std::vector<int>& layers, std::string& why);
// The list as parse_layer_list reads it: "3,2,2".
std::string layers_text(const std::vector<int>& layers);
void check_stage_layers(const std::vector<int>& layers, int n_layer, int num_stages,
                        const std::string& text = "");

// First layer of every stage, then n_layer (prefix sums): stage k owns layers
// bounds[k] .. bounds[k+1]-1. Size num_stages + 1.
std::vector<int> stage_bounds(const std::vector<int>& layers_per_stage);

}  // namespace meshlm
