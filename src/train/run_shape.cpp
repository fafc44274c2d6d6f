#include "train/run_shape.h"

#include "load/base_loader.h"
#include "train/backend.h"
#include "train/engine.h"

namespace meshlm {

RunMemoryOptions memory_options(const RunConfig& cfg, uint64_t windows) {
  const BackendCaps& caps = backend_caps(cfg.runtime.backend);
  RunMemoryOptions o;
  o.windows = windows;
  o.shuffle = cfg.data.shuffle;
  o.checkpoint_async = cfg.checkpoint.async;
  o.cpu_gemm_warm_up = caps.openblas_warm_up;
  o.device = caps.device_memory;
  o.precision = cfg.train.precision;
  o.quant_type = cfg.quant.type;
  o.pp = cfg.parallel.pp;
  return o;
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
