// [parallel]: the process mesh (dp x tp x pp) and how one step is split over
// it. The planner turns it into what each rank holds (plan/rank_plan.h); the
// training engine runs it.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "model/gpt.h"
#include "model/gpt_config.h"

namespace meshlm {

// Pipeline schedules (plan/pipeline_schedule.h has their action lists).
enum class PipelineSchedule { gpipe, one_f_one_b };
inline constexpr EnumName<PipelineSchedule> kPipelineScheduleNames[] = {
    {PipelineSchedule::gpipe, "gpipe"},
    {PipelineSchedule::one_f_one_b, "1f1b"},
};
constexpr std::span<const EnumName<PipelineSchedule>> enum_names(PipelineSchedule) {
  return kPipelineScheduleNames;
}

// parallel.layout: who chooses dp, tp, pp and the rest of [parallel].
enum class LayoutChoice {
  manual,     // the file's [parallel] keys
  automatic,  // the planner's fastest layout that fits (train/layout_search.h)
};
inline constexpr EnumName<LayoutChoice> kLayoutChoiceNames[] = {
    {LayoutChoice::manual, "manual"},
    {LayoutChoice::automatic, "auto"},
};
constexpr std::span<const EnumName<LayoutChoice>> enum_names(LayoutChoice) { return kLayoutChoiceNames; }

// Layers per pipeline stage as written ("3,3,2,2"); empty = balanced by cost.
struct StageLayers {
  std::vector<int> layers;
  bool operator==(const StageLayers&) const = default;
};

struct ParallelConfig {
  LayoutChoice layout = LayoutChoice::manual;
  int dp = 0, tp = 1, pp = 1;  // dp * tp * pp = ranks of the job; dp 0 = ranks / (tp * pp)
  int zero_stage = 0;          // 0, 1 (optimizer sharded over DP), 2 (+ gradients)
  int micro_batches = 0;       // per DP rank and step; 0 = from train.micro_batch_size
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  Checkpointing activation_checkpointing = Checkpointing::none;
  StageLayers stage_layers;
  int ranks_per_node = 0;      // > 0 splits each node into groups of this many ranks

  // The [parallel] keys against each other and the model (micro_batches
  // resolved): CollectiveError naming the keys. The world size is checked
  // where it is known, by the process mesh.
  void validate(const GPTConfig& model) const;
};

// Micro-batches of activations stage `stage` keeps at once under the
// schedule: m for GPipe, min(pp - stage, m) for 1F1B (its warm-up of
// pp - stage - 1 forwards plus the one in flight).
int in_flight_micro_batches(PipelineSchedule s, int stage, int pp, int micro_batches);

}  // namespace meshlm
