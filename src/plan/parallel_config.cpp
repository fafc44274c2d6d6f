#include "plan/parallel_config.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "plan/partition.h"

namespace meshlm {

void ParallelConfig::validate(const GPTConfig& m) const {
  auto fail = [](const std::string& msg) { throw CollectiveError(msg, MESHLM_HERE); };
  auto str = [](int v) { return std::to_string(v); };
  if (tp < 1) fail("parallel.tp must be >= 1 (got " + str(tp) + ")");
  if (pp < 1) fail("parallel.pp must be >= 1 (got " + str(pp) + ")");
  if (zero_stage < 0 || zero_stage > 2)
    fail("parallel.zero_stage must be 0, 1 or 2 (got " + str(zero_stage) + ")");
  if (ranks_per_node < 0)
    fail("parallel.ranks_per_node must be >= 0 (got " + str(ranks_per_node) + ")");
  if (m.n_head % tp != 0)
    fail("model.n_head (" + str(m.n_head) + ") must be divisible by parallel.tp (" + str(tp) +
         "): tensor parallelism splits the heads");
  if (m.mlp_width() % tp != 0)
    fail("model.intermediate_size (" + str(m.mlp_width()) + ") must be divisible by parallel.tp (" +
         str(tp) + "): tensor parallelism splits the MLP");
  if (m.padded_vocab_size() % tp != 0)
    fail("the padded vocabulary (model.vocab_size " + str(m.vocab_size) + " -> " +
         str(m.padded_vocab_size()) + ") must be divisible by parallel.tp (" + str(tp) + ")");
  if (pp > m.n_layer)
    fail("parallel.pp (" + str(pp) + ") is more pipeline stages than model.n_layer (" +
         str(m.n_layer) + ") layers");
  if (schedule == PipelineSchedule::one_f_one_b && micro_batches < pp)
    fail("parallel.micro_batches (" + str(micro_batches) + ") must be >= parallel.pp (" + str(pp) +
         ") under parallel.schedule = 1f1b (raise train.batch_size, lower train.micro_batch_size, "
         "or use gpipe)");
  if (!stage_layers.layers.empty()) check_stage_layers(stage_layers.layers, m.n_layer, pp);
}

int in_flight_micro_batches(PipelineSchedule s, int stage, int pp, int m) {
  return s == PipelineSchedule::gpipe ? m : std::min(pp - stage, m);
}

}  // namespace meshlm
