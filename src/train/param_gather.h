// The whole model's trained parameters on one rank, for output (the run's
// final parameters, checks against a one-rank run).
#pragma once

#include <vector>

#include "comm/comm.h"
#include "mesh/mesh.h"
#include "model/gpt.h"
#include "train/run_config.h"

namespace meshlm {

// Collective over `world` (the mesh's world group): every rank of DP replica
// 0 sends its shard to world rank 0, which puts each tensor's part into the
// logical tensor. Returns, on world rank 0, the tensors one after the other
// in the order of trainable_table(cfg.model, {}, ...) (the GPT-2 table, or
// the adapters' under LoRA; logical shapes); empty on the other ranks.
// Throws RankError (rank 0) when a later stage's copy of a tied tensor
// differs from the first stage's.
std::vector<float> gather_params(const RunConfig& cfg, const ProcessMesh& mesh,
                                 comm::Communicator& world, const GPT& model);

}  // namespace meshlm
