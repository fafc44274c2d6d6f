// Test-only behaviour of a run behind one seam: the failures [debug] injects
// (a RankError in a forward, a NaN in a gradient, a SIGKILL inside a
// checkpoint's save) and the records a test keeps (every step's result, the
// final parameters). The engine, the checkpointer and the training loop are
// given one debug::Faults and ask it at their fault points; nothing else in
// the step or the write path knows about tests. A default Faults injects
// nothing and keeps nothing.
#pragma once

#include <cstdint>

#include "train/run_config.h"

namespace meshlm::debug {

// What run_training keeps for a test beyond what a run reports.
enum class Records { none, every_step };

class Faults {
public:
  Faults() = default;
  // The [debug] section as world rank `rank` applies it.
  Faults(const DebugConfig& d, int rank, Records records = Records::none)
      : d_(d), rank_(rank), records_(records) {}

  // Engine::step, in the forward of every micro-batch of step `step`: the
  // RankError of debug.fail_rank / debug.fail_step.
  void in_forward(int step) const;
  // Engine::step, after the gradients are reduced: whether this rank puts a
  // NaN into its first owned gradient (debug.nan_step, nan_count; world
  // rank 0).
  bool poisons_gradients(int step) const;
  // Checkpointer: this rank dies (SIGKILL, as a node failure or kill -9
  // would end it) at `point` of the save of `step`, where
  // debug.kill_in_checkpoint, kill_step and kill_rank say so.
  void in_checkpoint(int64_t step, const char* point) const;
  // Whether the run keeps every step's record and gathers the final
  // parameters (TrainSummary::steps, final_params).
  bool keeps_records() const { return records_ == Records::every_step; }

private:
  DebugConfig d_;
  int rank_ = -1;
  Records records_ = Records::none;
};

}  // namespace meshlm::debug
