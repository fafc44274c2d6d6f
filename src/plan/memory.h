// The memory model: bytes per category that one rank will hold, predicted
// from the configuration before anything is allocated, and set beside what
// the tracked allocator measured at the end of the run.
//
// For a rank holding `shard` (its pipeline stage's layers, its tensor-
// parallel part), with n = parameters of its table, padded to np (a multiple
// of dp under ZeRO, so shards are equal: S = np / dp):
//   params      = np * 4
//   grads       = np * 4                   ZeRO 0, 1
//               = (S + Lb + E) * 4         ZeRO 2: the owned shard, a bucket of the
//                                          largest block (Lb) and the embeddings
//                                          and final norm (E), reduced at step end
//   optimizer   = 2 n * 4                  ZeRO 0: AdamW m and v of everything
//               = 2 S * 4                  ZeRO 1, 2: of the owned shard only
//   activations = GPT::activation_bytes(cfg, shard, options, micro_batch, seq_len)
//   comm        = slots * B * T * C * 4    pipeline stages > 0: gradients being sent back
//   workspace   = largest split tensor, whole, * 4   (tp > 1: initialisation)
//   other       = windows * 4              the shuffled order of one epoch
//
// Under LoRA (finetune.mode = lora) the table is the adapters' (n counts
// adapter elements only: the base has no gradients and no optimizer state),
// and:
//   params     += frozen vectors of the shard (biases, LayerNorm) * 4
//   quantized   = the whole quantized store on the rank that holds it (node
//                 rank 0 under quant.share = node; every rank under per_rank)
//   workspace   = max(the above, the largest source tensor * 4 on a rank
//                 that quantizes: rank 0, or every rank under per_rank)
//   activations include the adapters' and dequantization scratch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/alloc.h"
#include "model/gpt_config.h"
#include "model/gpt.h"
#include "model/param_table.h"
#include "plan/rank_plan.h"

namespace meshlm {

// The ZeRO view of a rank's flat buffer: np padded elements, shard S each.
struct ZeroLayout {
  size_t n = 0, padded = 0, shard = 0;
};
ZeroLayout zero_layout(const GPTConfig& cfg, const RankPlan& r);
// Elements of the largest transformer block of the shard, and of the tensors
// outside the blocks (wte, wpe, ln_f) it holds.
size_t largest_block_numel(const std::vector<ParamSpec>& table);
size_t edge_numel(const std::vector<ParamSpec>& table);

MemoryByCategory predict_memory(const GPTConfig& model, const RankPlan& rank,
                                uint64_t windows_per_epoch, bool shuffle);
// The whole model on one rank, no parallelism.
MemoryByCategory predict_memory(const GPTConfig& model, int micro_batch_size, int seq_len,
                                uint64_t windows_per_epoch, bool shuffle);

}  // namespace meshlm
