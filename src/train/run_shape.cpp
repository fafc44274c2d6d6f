#include "train/run_shape.h"

#include <algorithm>
#include <memory>
#include <tuple>
#include <vector>

#include "core/alloc.h"
#include "core/kept.h"
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

// load::store_pages_read for the rank's shard, kept per shard (core/kept.h):
// the planner's stage balancing asks it for hundreds of distinct shards (477
// for 8 ranks of Llama 3 8B), each many times over.
size_t shared_pages_read(const RunConfig& cfg, const load::StoreManifest& manifest,
                         const ModelShard& shard) {
  const size_t page = page_bytes();
  thread_local KeptValues<std::tuple<GPTConfig, quant::QuantType, int, size_t>, ModelShard, size_t>
      kept(1 << 16);
  return kept.get({cfg.model, cfg.quant.type, cfg.train.seq_len, page}, shard, [&] {
    return load::store_pages_read(manifest, cfg.model, shard, cfg.train.seq_len, page);
  });
}

// load::make_manifest, kept for the next rank of the same model.
std::shared_ptr<const load::StoreManifest> shared_manifest(const GPTConfig& model,
                                                           quant::QuantType type) {
  thread_local KeptValues<GPTConfig, quant::QuantType, std::shared_ptr<const load::StoreManifest>>
      kept(4);
  return kept.get(model, type, [&] {
    return std::make_shared<const load::StoreManifest>(load::make_manifest(model, type));
  });
}

}  // namespace

RankPlan rank_plan_at(const RunConfig& cfg, const MeshCoords& c, int world_rank, int node_rank) {
  RankPlan shape = Engine::plan_of(cfg, c);
  if (shape.model.lora.enabled) {
    const auto manifest_kept = shared_manifest(cfg.model, cfg.quant.type);
    const load::StoreManifest& manifest = *manifest_kept;
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
