#include "train/run_shape.h"

#include <algorithm>
#include <vector>

#include "core/alloc.h"
#include "load/base_loader.h"
#include "train/backend.h"
#include "train/engine.h"

namespace meshlm {

RunMemoryOptions memory_options(const RunConfig& cfg, uint64_t windows, const GroupPaths& paths,
                                int threads) {
  const BackendCaps& caps = backend_caps(cfg.runtime.backend);
  RunMemoryOptions o;
  o.windows = windows;
  o.shuffle = cfg.data.shuffle;
  o.checkpoint_async = cfg.checkpoint.async;
  o.cpu_gemm_warm_up = caps.openblas_warm_up;
  o.device = caps.device_memory;
  o.device_workspace = caps.device_workspace;
  o.precision = cfg.train.precision;
  o.rounding_threads = rounding_threads(caps, o.precision, threads);
  o.quant_type = cfg.quant.type;
  o.pp = cfg.parallel.pp;
  o.overlap_bytes = dp_overlap_bytes(cfg, paths);
  // A device backend's groups that are not NCCL's stage their device
  // buffers through the host.
  if (caps.device_memory) {
    o.host_groups = {!paths.nccl(kGroupDp), !paths.nccl(kGroupTp), !paths.nccl(kGroupPp),
                     !paths.nccl(kGroupEmbedding), !paths.nccl(kGroupWorld)};
    if (o.host_groups.any()) o.staging_bytes = cfg.comm.staging_bytes();
  }
  return o;
}

size_t base_broadcast_chunk_bytes(const RunConfig& cfg, size_t store_bytes) {
  return std::min(cfg.comm.staging_bytes(), store_bytes);
}

RankPlan planned_rank_plan(const RunConfig& cfg, const ProcessMesh& mesh) {
  return rank_plan_at(cfg, mesh.coords(), mesh.rank(), mesh.node_rank());
}

namespace {

// load::store_pages_read for the rank's shard; the planner asks it for
// every rank of every layout, and the ranks of one shard (tp rank, stage)
// read the same pages: the last answers of the calling thread are kept.
size_t shared_pages_read(const RunConfig& cfg, const load::StoreManifest& manifest,
                         const ModelShard& shard) {
  struct Kept {
    GPTConfig model;
    quant::QuantType type;
    ModelShard shard;
    int seq_len;
    size_t page, bytes;
  };
  constexpr size_t kKept = 16;
  thread_local std::vector<Kept> kept;
  const size_t page = page_bytes();
  for (const Kept& k : kept)
    if (k.shard == shard && k.type == cfg.quant.type && k.seq_len == cfg.train.seq_len &&
        k.page == page && k.model == cfg.model)
      return k.bytes;
  const size_t bytes =
      load::store_pages_read(manifest, cfg.model, shard, cfg.train.seq_len, page);
  if (kept.size() == kKept) kept.erase(kept.begin());
  kept.push_back({cfg.model, cfg.quant.type, shard, cfg.train.seq_len, page, bytes});
  return bytes;
}

}  // namespace

RankPlan rank_plan_at(const RunConfig& cfg, const MeshCoords& c, int world_rank, int node_rank) {
  RankPlan shape = Engine::plan_of(cfg, c);
  if (shape.model.lora.enabled) {
    const load::StoreManifest manifest = load::make_manifest(cfg.model, cfg.quant.type);
    const bool per_rank = cfg.quant.share == quant::ShareMode::per_rank;
    const bool holder = per_rank || node_rank == 0;
    const bool quantizes = per_rank || world_rank == 0;
    shape.quantized_bytes = holder ? manifest.bytes : 0;
    shape.base_staging_bytes = quantizes ? manifest.staging_bytes() : 0;
    if (!per_rank && node_rank == 0 && cfg.quant.broadcast == quant::BaseBroadcast::nccl)
      shape.base_broadcast_bytes = base_broadcast_chunk_bytes(cfg, manifest.bytes);
    if (!holder) shape.shared_read_bytes = shared_pages_read(cfg, manifest, shape.shard);
  }
  return shape;
}

}  // namespace meshlm
