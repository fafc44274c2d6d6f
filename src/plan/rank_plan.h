// From a layout to what one rank holds: the translation the training engine,
// the memory predictor (plan/memory.h) and the layout search all use.
#pragma once

#include <cstddef>
#include <vector>

#include "mesh/mesh.h"
#include "model/gpt_config.h"
#include "model/gpt_options.h"
#include "model/lora.h"
#include "model/param_table.h"
#include "plan/parallel_config.h"

namespace meshlm {

// What one rank holds and runs.
struct RankPlan {
  ModelShard shard;
  GPTOptions model;      // slots, checkpointing, padding, own_grads, LoRA
  int micro_batch = 1;   // B
  int seq_len = 1;       // T
  int dp = 1;
  int dp_rank = 0;
  int zero_stage = 0;
  int pipeline_stage = 0;
  // LoRA on a frozen base (set where the mesh is known):
  size_t quantized_bytes = 0;     // the store held in this rank's memory (node holder or per_rank)
  size_t base_staging_bytes = 0;  // a rank that quantizes: a block of fp32 source rows + nf4 absmax
  size_t base_broadcast_bytes = 0;  // quant.broadcast = nccl: a node leader's device chunk
  size_t shared_read_bytes = 0;   // pages of the node's store another rank holds that it reads
};

// The layers of every pipeline stage: parallel.stage_layers, or balanced by
// cost (plan/partition.h) for sequences of seq_len.
std::vector<int> stage_layers(const GPTConfig& model, const ParallelConfig& p, int seq_len);

// The plan of the rank at coordinates `c` of the layout `p` (micro_batches
// resolved), training micro-batches of (micro_batch, seq_len), whose
// attention keeps what `attention` says (probabilities or flash).
RankPlan plan_rank(const GPTConfig& model, const ParallelConfig& p, const FinetuneConfig& f,
                   int micro_batch, int seq_len, const MeshCoords& c, Attention attention);

}  // namespace meshlm
