// One rank's share of a distributed training step over the process mesh:
// its model shard (pipeline stage x tensor-parallel part), the pipeline
// executor, the data-parallel gradient reduction with ZeRO 0/1/2, and AdamW
// on the elements this rank owns.
//
// A step, on every rank:
//   1. the stage's schedule (GPipe or 1F1B) runs: forward/backward of each
//      micro-batch, activations and their gradients sent between stages;
//      tensor-parallel sums inside the layers;
//   2. the tied embedding's gradient is summed between the first and last
//      stage (they hold the same wte);
//   3. gradients are reduced over DP: all-reduce (ZeRO 0), reduce-scatter
//      (ZeRO 1), or already reduced block by block into the owner's shard
//      during backward (ZeRO 2);
//   4. the global gradient norm is clipped and AdamW updates the owned
//      elements; under ZeRO 1/2 the updated shards are all-gathered.
// Every micro-batch's loss is scaled by 1 / (micro_batches * dp), so the sum
// over DP is the mean over the global batch, as on one rank.
#pragma once

#include <memory>
#include <vector>

#include "comm/comm.h"
#include "core/timer.h"
#include "mesh/mesh.h"
#include "model/gpt.h"
#include "plan/memory.h"
#include "plan/rank_plan.h"
#include "load/base_loader.h"
#include "train/adamw.h"
#include "train/pipeline_schedule.h"
#include "train/run_config.h"

namespace meshlm {

struct StepResult {
  double loss = 0;       // mean over the global batch (on every rank)
  double grad_norm = 0;  // global, before clipping (on every rank)
};

class Engine {
public:
  // Collective over mesh.world(). The mesh must outlive the engine; so must
  // `base`, the frozen base model, which finetune.mode = lora needs.
  Engine(const RunConfig& cfg, const ProcessMesh& mesh, SectionTimers& timers,
         const load::FrozenBase* base = nullptr);
  ~Engine();

  // What the rank at `c` holds under `cfg` (plan/rank_plan.h).
  static RankPlan plan_of(const RunConfig& cfg, const MeshCoords& c);

  // Collective: one optimizer step. tokens/targets hold this DP rank's
  // micro_batches() micro-batches of (B, T) each, one after the other.
  StepResult step(const int32_t* tokens, const int32_t* targets, float lr, int step_number);

  // Collective over the world: the whole model's trained parameters, tensor
  // after tensor in the order of trainable_table(cfg, {}, options) (the GPT-2
  // table, or the adapters' under LoRA; logical shapes), on world rank 0;
  // empty on the other ranks. Throws RankError (rank 0) when the
  // last stage's copy of the tied wte differs from the first stage's.
  std::vector<float> gather_params();

  const GPT& model() const { return *model_; }
  const RankPlan& shape() const { return shape_; }
  int micro_batches() const { return m_; }
  const std::vector<Action>& schedule() const { return schedule_; }

private:
  void run_schedule(const int32_t* tokens, const int32_t* targets, int step_number,
                    double& loss_sum);
  void reduce_gradients();
  // ZeRO 2: sums the gradients of the flat elements [a, b), held in src,
  // into the shards of their owners (collective over DP).
  void reduce_to_owners(float* src, size_t a, size_t b);
  double clip_owned(double max_norm);
  // Full training with quant.base set: the parameters start from those
  // weights (collective over the world).
  void load_base_params();

  const RunConfig& cfg_;
  const ProcessMesh& mesh_;
  SectionTimers& timers_;
  std::unique_ptr<comm::Communicator> tp_, dp_, emb_, world_;
  // Two views of the PP group: operations on one Communicator complete in
  // issue order, and a receive must not wait behind a send still in flight
  // (as sends and receives on separate streams under NCCL).
  std::unique_ptr<comm::Communicator> pp_send_, pp_recv_;
  RankPlan shape_;
  ZeroLayout zero_;
  int m_ = 1, B_ = 1, T_ = 1;
  std::vector<Action> schedule_;
  std::unique_ptr<GPT> model_;
  std::unique_ptr<AdamW> opt_;
  size_t own_begin_ = 0, own_end_ = 0;  // the flat elements this rank updates

  // ZeRO 2 gradient storage (grads category).
  Buffer shard_grads_, bucket_, edge_grads_;
  std::vector<size_t> edge_offset_;                 // per table entry, into edge_grads_
  std::vector<std::pair<size_t, size_t>> block_range_;  // per local block, flat [a, b)

  // Pipeline: gradients sent back to the previous stage, one per slot.
  Buffer send_back_;
  std::vector<comm::Handle> fwd_sends_, bwd_sends_;
};

}  // namespace meshlm
