// The training loop: every function here is called by every rank of `job`
// together. The ranks form the process mesh of [parallel] (dp x tp x pp).
#pragma once

#include <mpi.h>

#include <vector>

#include "mesh/mesh.h"
#include "plan/memory.h"
#include "load/base_loader.h"
#include "train/faults.h"
#include "train/run_config.h"

namespace meshlm {

struct StepRecord {
  int step = 0;
  double loss = 0;          // mean over the step's micro-batches
  double lr = 0;
  double grad_norm = 0;     // before clipping
  double seconds = 0;
  double tokens_per_s = 0;
};

struct TrainSummary {
  // Every step, logged or not, but the skipped ones, when run_training was
  // asked for them (tests); a long run keeps none (it would grow by a
  // record a step: run.h5 has the logged ones).
  std::vector<StepRecord> steps;
  int trained_steps = 0;          // the steps trained, skipped ones not counted
  int skipped_steps = 0;          // train.on_nonfinite = skip: steps dropped
  int overflow_steps = 0;         // train.precision = fp16: steps skipped as overflowed
  int stopped_by_signal = 0;      // SIGTERM / SIGUSR1 ended training early (a checkpoint was written)
  double loss_scale = 1;          // fp16: the loss scale at the end
  double seconds = 0;
  // The whole model's parameters at the end, in the order of
  // gpt_param_table(cfg.model), on rank 0 when asked for (tests).
  std::vector<float> final_params;
};

// Collective over `job`: prepares the data (tokenizing data.tokenize_from
// when asked), builds and initialises the model, trains train.steps steps,
// prints a line every train.log_every steps and the memory and timing tables
// at the end, and writes <output.dir>/run.h5 on rank 0. Resumes from a
// checkpoint and writes checkpoints as [checkpoint] says (train/checkpoint.h);
// a SIGTERM or SIGUSR1 ends training after the current step with one. A [parallel] layout
// whose dp * tp * pp is not the size of `job` is a CollectiveError.
// `records` = every_step (a test's): keep every step's record and gather the
// final parameters (train/faults.h).
TrainSummary run_training(const RunConfig& cfg, MPI_Comm job,
                          debug::Records records = debug::Records::none);

// What this rank of `mesh` will hold, as the planner predicts it: its shard
// and, under LoRA, the quantized store where this rank holds it (the node's
// rank 0, or every rank under quant.share = per_rank) and the fp32 staging
// of a rank that quantizes (the cache may spare it).
RankPlan planned_rank_plan(const RunConfig& cfg, const ProcessMesh& mesh);
// The same without a mesh (meshlm plan): the rank `world_rank` at
// coordinates `c`, the `node_rank`-th of its node.
RankPlan rank_plan_at(const RunConfig& cfg, const MeshCoords& c, int world_rank, int node_rank);

// The scratch of the ring reductions (comm/mpi_comm.h) this rank will make:
// the largest of its gradient reductions over dp, its activations' over tp
// and the tied embedding's over pp, under comm.bucket_mb.
size_t ring_scratch_prediction(const RunConfig& cfg, const RankPlan& shape);

// What the trainer predicts is live at each phase of the run on the host
// (plan/memory.h, predict_phases, with the ring's scratch in training), for
// `windows` training windows per epoch: the prediction its memory table and
// the tests set beside the tracked allocator.
PhasedMemory predict_run_phases(const RunConfig& cfg, const RankPlan& shape, uint64_t windows);
// The per-category prediction the run prints and writes to run.h5
// (memory/<category>/predicted_bytes): each category's peak over `phased`,
// and on the CUDA backend the device's own (the GEMMs' 16-bit copies, the
// reductions' scratch, the upload staging, the NF4 matrices), host and
// device added.
MemoryByCategory predicted_categories(const RunConfig& cfg, const RankPlan& shape,
                                      const PhasedMemory& phased);

// The CUDA backend's 16-bit copies of its GEMM inputs at bf16 and fp16
// (ops/gpu_workspace.h) for a rank holding `shape` and training
// micro-batches of (B, T): the largest pair of spans any GEMM of the step
// reads, each GEMM written down with the arguments of its call, plus the
// classifier's weight held rounded for its chunks; 0 at fp32.
size_t gpu_gemm_copies_bytes(const GPTConfig& m, const RankPlan& shape, ops::Precision p, int B,
                             int T);
// The CUDA backend's scratch of reductions over rows (ops/gpu_workspace.h)
// for the same rank: the column sums' partials of the widest bias or
// LayerNorm gradient, and the embedding's index; none where those tensors
// are frozen (LoRA).
size_t gpu_reduction_scratch_bytes(const GPTConfig& m, const RankPlan& shape, int B, int T);
// The CUDA backend's scratch of the gradient norm over the tensors `trained`.
size_t gpu_norm_scratch_bytes(const std::vector<ParamSpec>& trained);

}  // namespace meshlm
