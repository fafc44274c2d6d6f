// One rank's share of a distributed training step over the process mesh. The
// engine wires the parts together, each in its own file: the model shard
// (model/gpt.h: pipeline stage x tensor-parallel part), the pipeline runner
// (train/pipeline_runner.h), ZeRO over the data-parallel group
// (train/zero.h) and AdamW on the elements this rank owns (train/adamw.h).
//
// A step, on every rank:
//   1. the stage's schedule (GPipe or 1F1B) runs: forward/backward of each
//      micro-batch, activations and their gradients sent between stages;
//      tensor-parallel sums inside the layers;
//   2. the tied embedding's gradient is summed between the first and last
//      stage (they hold the same wte);
//   3. gradients are reduced over DP (ZeRO decides how);
//   4. the global gradient norm is clipped and AdamW updates the owned
//      elements; ZeRO shares the updated shards again. Under fp16 the
//      gradients carry the loss scale (train/loss_scaler.h) until here: a
//      step whose scaled gradients overflowed stops before 4, the others
//      are unscaled first.
// Every micro-batch's loss is scaled by 1 / (micro_batches * dp), so the sum
// over DP is the mean over the global batch, as on one rank.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "core/timer.h"
#include "load/base_loader.h"
#include "mesh/mesh.h"
#include "model/gpt.h"
#include "plan/rank_plan.h"
#include "train/adamw.h"
#include "train/device_access.h"
#include "train/faults.h"
#include "train/group_comm.h"
#include "train/loss_scaler.h"
#include "train/pipeline_runner.h"
#include "train/run_config.h"
#include "train/zero.h"

namespace meshlm {

struct StepResult {
  double loss = 0;       // mean over the global batch (on every rank)
  double grad_norm = 0;  // global, before clipping (on every rank)
  // The loss or the gradient norm is NaN or infinite: nothing was updated.
  bool nonfinite = false;
  // Then: the first tensor (in the whole model's table) whose gradient is not
  // finite, or "" when every gradient is (on every rank).
  std::string nonfinite_tensor;
  // train.precision = fp16: the scaled gradients overflowed, so nothing was
  // updated and the loss scale halved (not an error: nonfinite stays false).
  bool overflow = false;
  double loss_scale = 1;  // the scale this step's backward ran with
};

class Engine {
public:
  // Collective over mesh.world(). The mesh must outlive the engine; so must
  // `base`, the frozen base model, which finetune.mode = lora needs, and
  // `kernels` and `dequantizer`, the backend the rank computes on
  // (train/backend.h). `faults`: the failures a test injects into the step
  // (train/faults.h; none by default). `route`: how a device backend's
  // buffers move between the ranks of a group (train/group_comm.h; unused
  // on the CPU, whose buffers MPI moves).
  Engine(const RunConfig& cfg, const ProcessMesh& mesh, SectionTimers& timers,
         const load::FrozenBase* base = nullptr,
         const ops::Kernels& kernels = ops::Kernels::cpu(),
         const quant::Dequantizer& dequantizer = quant::Dequantizer::cpu(),
         debug::Faults faults = {}, const DeviceRoute& route = {});
  ~Engine();

  // What the rank at `c` holds under `cfg` (plan/rank_plan.h).
  static RankPlan plan_of(const RunConfig& cfg, const MeshCoords& c);

  // Collective: one optimizer step. tokens/targets hold this DP rank's
  // micro_batches() micro-batches of (B, T) each, one after the other.
  StepResult step(const int32_t* tokens, const int32_t* targets, float lr, int step_number);

  // Collective: the mean loss of one global batch, forward only (evaluation):
  // tokens/targets as step()'s; the stage's forward-only list runs the same
  // forward as training into the same activation slots, without the
  // classifier's backward, and nothing else is touched (no gradient, no
  // optimizer state, no loss scale), so training goes on as if it had not
  // run. The same value on every rank.
  double eval_loss(const int32_t* tokens, const int32_t* targets);

  // Collective over the world: the whole model's trained parameters on world
  // rank 0 (train/param_gather.h).
  std::vector<float> gather_params();

  const GPT& model() const { return *model_; }
  // What a checkpoint saves and restores (train/checkpoint.h): the model's
  // parameters, the optimizer's moments and step count, the loss scale, and
  // which elements ZeRO gives this rank.
  GPT& model() { return *model_; }
  AdamW& optimizer() { return *opt_; }
  LossScaler& loss_scaler() { return scaler_; }
  const Zero& zero() const { return *zero_; }
  const RankPlan& shape() const { return shape_; }
  int micro_batches() const { return cfg_.parallel.micro_batches; }
  const std::vector<Action>& schedule() const { return pipeline_->schedule(); }
  const LossScaler& loss_scaler() const { return scaler_; }

private:
  // Full training with quant.base set: the parameters start from those
  // weights (collective over the world).
  void load_base_params();
  // Collective over the world: the communicators of the rank's groups, with
  // their device paths chosen (train/group_comm.h); the paths printed.
  void make_communicators(const ops::Kernels& kernels, const DeviceRoute& route);
  // The tied tensors' gradients summed onto the first stage that
  // holds them, which alone updates them (plan/memory.h, optimizer_range).
  void sum_tied_gradients();
  // After the update: the other stages take the first stage's tied tensors.
  void share_tied_params();
  // The global norm of the gradients as they are (collective over the world).
  double global_grad_norm();
  // Collective over the world: the mean over the global batch of the last
  // stage's sum of its micro-batches' mean losses (0 on other stages).
  double global_mean_loss(double stage_loss_sum);
  // Collective over the world: StepResult::nonfinite_tensor.
  std::string first_nonfinite_tensor();

  const RunConfig& cfg_;
  const ProcessMesh& mesh_;
  SectionTimers& timers_;
  const debug::Faults faults_;
  // How host staging reaches the device's buffers (device backends).
  std::unique_ptr<KernelsDeviceAccess> device_access_;
  std::unique_ptr<comm::Communicator> tp_, dp_, emb_, world_;
  // Two views of the PP group (see PipelineRunner); under NCCL one, its
  // links (comm/pipeline_links.h), and pp_recv_ null.
  std::unique_ptr<comm::Communicator> pp_send_, pp_recv_;
  bool pp_through_host_ = false;  // a device's activations staged through the host
  bool world_through_host_ = false;  // ... and the tied embedding's pieces under ZeRO 2
  Buffer tied_host_;
  RankPlan shape_;
  std::unique_ptr<GPT> model_;
  std::unique_ptr<PipelineRunner> pipeline_;
  std::unique_ptr<Zero> zero_;
  std::unique_ptr<AdamW> opt_;
  LossScaler scaler_;
  // ZeRO 2 under pp, on the embedding group: (offset of wte, ZeRO shard) in
  // the first and the last stage's flat buffers, wte's elements and the most
  // sent at once (the first stage's bucket); see sum_tied_gradients.
  struct TiedShards {
    std::pair<size_t, size_t> first, last;
    size_t n = 0, piece = 0;
  } tied_;
};

}  // namespace meshlm
