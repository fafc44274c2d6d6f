// The memory a run's rank will hold, predicted before anything is
// allocated (train/memory_prediction.h): plan/memory.h's categories by
// phase, the rings' scratch of this run's reductions, checkpoint.async's
// snapshot, and on a GPU the model's step workspace (model/gpu_step.h).
#include "train/memory_prediction.h"

#include <algorithm>

#include "comm/mpi_comm.h"
#include "load/base_loader.h"
#include "model/gpu_step.h"
#include "ops/blas.h"
#include "train/backend.h"
#include "train/engine.h"
#include "train/zero.h"

namespace meshlm {

size_t ring_scratch_prediction(const RunConfig& cfg, const RankPlan& shape) {
  using comm::Reduction;
  const std::vector<ParamSpec> table = trainable_table(cfg.model, shape.shard, shape.model);
  // Gradients over dp, as ZeRO reduces them.
  size_t most = Zero::ring_scratch_bytes(shape.zero_stage, table, zero_layout(cfg.model, shape),
                                         cfg.parallel.dp, shape.dp_rank,
                                         zero2_wte_rows(cfg.model, shape, table));
  // Over tp: the activations in and out of each tensor-parallel region, the
  // LoRA adapters' partial gradients, the classifier's row statistics.
  const int tp = shape.shard.tp_size;
  const size_t N = static_cast<size_t>(cfg.train.micro_batch_size) * cfg.train.seq_len;
  size_t tp_count = std::max(N * cfg.model.n_embd, 2 * N);
  // (Of the parameters only a LoRA factor that every TP rank holds whole
  // gets a partial gradient summed over tp: model/gpt_linear.cpp.)
  for (const ParamSpec& p : table)
    if ((p.role == ParamRole::lora_a || p.role == ParamRole::lora_b) && p.tp_dim < 0)
      tp_count = std::max(tp_count, p.numel());
  most = std::max(most, comm::ring_scratch_bytes_of(Reduction::all_reduce, tp_count, DType::f32, tp));
  // Over pp: the tied embedding's gradient, from the last stage to the first
  // (the root; the last stage starts the chain and needs no scratch).
  // (ZeRO 2 sends it in pieces through its bucket instead).
  if (cfg.parallel.pp > 1 && shape.shard.first_stage && shape.zero_stage < 2)
    for (const ParamSpec& p : table)
      if (p.tied != TiedGroup::none)
        most = std::max(most,
                        comm::ring_scratch_bytes_of(Reduction::reduce, p.numel(), DType::f32, 2));
  return most;
}

PhasedMemory predict_run_phases(const RunConfig& cfg, const RankPlan& shape, uint64_t windows) {
  PhasedMemory phased = predict_phases(cfg.model, shape, windows, cfg.data.shuffle);
  phased.add(MemPhase::training, MemCategory::comm, ring_scratch_prediction(cfg, shape));
  // checkpoint.async: the host snapshot, made with the checkpointer after
  // the training buffers (the last moment of initialisation) and kept.
  if (cfg.checkpoint.async) {
    const size_t snapshot = checkpoint_snapshot_numel(cfg.model, shape) * sizeof(float);
    PhasedMemory::Moment* made = nullptr;
    for (PhasedMemory::Moment& m : phased.moments)
      if (m.phase == MemPhase::initialisation) made = &m;
    if (made) at(made->live, MemCategory::checkpoint) += snapshot;
    phased.add(MemPhase::training, MemCategory::checkpoint, snapshot);
  }
  // On the CPU the start-up's GEMM that makes OpenBLAS's buffer resident.
  if (backend_caps(cfg.runtime.backend).openblas_warm_up)
    phased.add(MemPhase::startup, MemCategory::workspace, ops::kGemmWarmUpFloats * sizeof(float));
  return phased;
}

MemoryByCategory predicted_categories(const RunConfig& cfg, const RankPlan& shape,
                                      const PhasedMemory& phased) {
  MemoryByCategory predicted = phased.category_peaks();
  if (!backend_caps(cfg.runtime.backend).device_memory) return predicted;
  const TrainConfig& tc = cfg.train;
  // On a GPU each trained tensor is made on the host a block of rows at a
  // time and uploaded (GPT::set_weights): host workspace of one block.
  const std::vector<ParamSpec> trained = trainable_table(cfg.model, shape.shard, shape.model);
  const size_t block = GPT::weight_block_bytes(trained, shape.shard.tp_size, /*host=*/false);
  // The table adds each category's host and device peaks: the staging
  // (host) and the GEMMs' 16-bit copies (device) count both.
  at(predicted, MemCategory::workspace) =
      std::max(at(predicted, MemCategory::workspace), block) +
      gpu_step_workspace_bytes(cfg.model, shape.shard, shape.model, tc.precision,
                               tc.micro_batch_size, tc.seq_len);
  if (shape.model.lora.enabled)
    at(predicted, MemCategory::quantized) +=
        GPT::quantized_matrix_bytes(cfg.model, shape.shard, cfg.quant.type);
  return predicted;
}

RankPlan planned_rank_plan(const RunConfig& cfg, const ProcessMesh& mesh) {
  return rank_plan_at(cfg, mesh.coords(), mesh.rank(), mesh.node_rank());
}

RankPlan rank_plan_at(const RunConfig& cfg, const MeshCoords& c, int world_rank, int node_rank) {
  RankPlan shape = Engine::plan_of(cfg, c);
  if (shape.model.lora.enabled) {
    const load::StoreManifest manifest = load::make_manifest(cfg.model, cfg.quant.type);
    const bool per_rank = cfg.quant.share == quant::ShareMode::per_rank;
    const bool holder = per_rank || node_rank == 0;
    const bool quantizes = per_rank || world_rank == 0;
    shape.quantized_bytes = holder ? manifest.bytes : 0;
    shape.base_staging_bytes = quantizes ? manifest.staging_bytes() : 0;
    if (!holder)
      shape.shared_read_bytes = load::store_pages_read(manifest, cfg.model, shape.shard,
                                                       cfg.train.seq_len, page_bytes());
  }
  return shape;
}

}  // namespace meshlm
