#include "plan/rank_plan.h"

#include <utility>

#include "core/kept.h"
#include "plan/partition.h"

namespace meshlm {

std::vector<int> stage_layers(const GPTConfig& model, const ParallelConfig& p, int seq_len) {
  if (!p.stage_layers.layers.empty()) return p.stage_layers.layers;
  // Kept (core/kept.h): every rank of a layout asks for the same split.
  thread_local KeptValues<GPTConfig, std::pair<int, int>, std::vector<int>> kept(1024);
  return kept.get(model, {p.pp, seq_len},
                  [&] { return balance_stages(model.n_layer, p.pp, gpt_stage_costs(model, seq_len)); });
}

RankPlan plan_rank(const GPTConfig& model, const ParallelConfig& p, const FinetuneConfig& f,
                   int micro_batch, int seq_len, const MeshCoords& c, Attention attention) {
  const std::vector<int> bounds = stage_bounds(stage_layers(model, p, seq_len));
  RankPlan r;
  r.shard.tp_rank = c.tp;
  r.shard.tp_size = p.tp;
  r.shard.layer_begin = bounds[c.pp];
  r.shard.layer_end = bounds[c.pp + 1];
  r.shard.first_stage = c.pp == 0;
  r.shard.last_stage = c.pp == p.pp - 1;
  r.model.slots = in_flight_micro_batches(p.schedule, c.pp, p.pp, p.micro_batches);
  r.model.micro_batches = p.micro_batches;
  r.model.checkpointing = p.activation_checkpointing;
  r.model.attention = attention;
  r.model.pad_multiple = p.zero_stage > 0 ? static_cast<size_t>(p.dp) : 1;
  r.model.own_grads = p.zero_stage < 2;
  r.model.lora = lora_options(f);
  r.micro_batch = micro_batch;
  r.seq_len = seq_len;
  r.dp = p.dp;
  r.dp_rank = c.dp;
  r.zero_stage = p.zero_stage;
  r.pipeline_stage = c.pp;
  return r;
}

}  // namespace meshlm
