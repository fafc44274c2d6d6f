// The memory a run's rank will hold, predicted before anything is
// allocated: what the planner (meshlm plan, the layout search), the
// trainer's memory table and the tests set beside what the tracked
// allocator measures. The categories and their phases are plan/memory.h's;
// this adds what the run's own options decide (its reductions' ring
// scratch, checkpoint.async's snapshot, the backend's device workspace from
// model/gpu_step.h).
#pragma once

#include <cstdint>

#include "mesh/mesh.h"
#include "plan/memory.h"
#include "plan/rank_plan.h"
#include "train/run_config.h"

namespace meshlm {

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

}  // namespace meshlm
