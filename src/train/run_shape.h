// What the memory predictor (plan/memory.h) reads of a run: the shape of
// one of its ranks (RankPlan: its shard, options and, under LoRA, where the
// quantized base lives) and the run's options that add to its memory
// (RunMemoryOptions: the data order, checkpoint.async, the backend). The
// prediction itself is plan/memory.h's; this only fills its inputs from a
// RunConfig.
#pragma once

#include <cstdint>

#include "mesh/mesh.h"
#include "plan/memory.h"
#include "plan/rank_plan.h"
#include "train/group_paths.h"
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

// quant.broadcast = nccl: the device chunk of a node leader, through which a
// store of `store_bytes` passes (comm.bucket_mb, at most the store).
size_t base_broadcast_chunk_bytes(const RunConfig& cfg, size_t store_bytes);

// The run's options as the prediction reads them, for `windows` training
// windows per epoch, on a rank of `threads` OpenMP threads whose groups
// take `paths` (comm.device resolved: train/group_paths.h).
RunMemoryOptions memory_options(const RunConfig& cfg, uint64_t windows, const GroupPaths& paths,
                                int threads);

}  // namespace meshlm
