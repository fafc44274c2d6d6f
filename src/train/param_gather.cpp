#include "train/param_gather.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "plan/rank_plan.h"

namespace meshlm {

std::vector<float> gather_params(const RunConfig& cfg, const ProcessMesh& mesh,
                                 comm::Communicator& world, const GPT& model) {
  const MeshLayout& layout = mesh.layout();
  const std::vector<ParamSpec> full_table = trainable_table(cfg.model, {}, model.options());
  std::vector<float> full;
  if (mesh.rank() != 0) {
    if (mesh.coords().dp == 0) {
      const std::vector<float> mine = model.host_params();
      world.send(mine.data(), mine.size(), DType::f32, 0).wait();
    }
    return full;
  }
  const std::vector<float> mine = model.host_params();
  full.assign(table_numel(full_table), 0.0f);
  std::vector<float> part;
  for (int r = 0; r < layout.world(); ++r) {
    const MeshCoords c = layout.coords(r);
    if (c.dp != 0) continue;
    const RankPlan s = plan_rank(cfg.model, cfg.parallel, cfg.finetune, cfg.train.micro_batch_size,
                                 cfg.train.seq_len, c, cfg.train.attention);
    const std::vector<ParamSpec> table = trainable_table(cfg.model, s.shard, s.model);
    const float* src = mine.data();
    if (r != 0) {
      part.resize(table_numel(table));
      world.recv(part.data(), part.size(), DType::f32, r).wait();
      src = part.data();
    }
    for (const ParamSpec& p : table) {
      float* dst = full.data() + full_table[p.index].offset;
      if (p.tied != TiedGroup::none && !s.shard.first_stage) {
        // A tied tensor's copy on a later stage must equal the first stage's,
        // bit for bit (stage 0 comes first in rank order, so it is already here).
        std::vector<float> copy(full_table[p.index].numel());
        std::copy(dst, dst + copy.size(), copy.begin());
        shard_to_full(p, src + p.offset, copy.data(), c.tp, s.shard.tp_size);
        if (!std::equal(copy.begin(), copy.end(), dst))
          throw RankError("the tied " + p.name + " of pipeline stage " + std::to_string(c.pp) +
                              " (rank " + std::to_string(r) + ") differs from the first stage's",
                          MESHLM_HERE);
        continue;
      }
      shard_to_full(p, src + p.offset, dst, c.tp, s.shard.tp_size);
    }
  }
  return full;
}

}  // namespace meshlm
