// `meshlm plan FILE.cfg --ranks N --ranks-per-node G ...`: the layouts of N
// ranks that fit the memory limits, ranked by the cost model's step time,
// without running anything (docs/planner.md). Each layout's memory is the
// prediction `meshlm train` makes for it (plan/memory.h: predict_run_phases,
// predicted_categories, on train/run_shape.h's rank_plan_at and
// memory_options), rank by rank.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace meshlm {

// Runs on one process (world rank 0 prints; no MPI communication). Returns
// the exit status; throws RankError naming the argument or key on bad input.
int cmd_plan(const std::vector<std::string>& args);

// The FILE of `--calibrate FILE` among plan's arguments, or "" (RankError
// on arguments plan does not take, the same on every rank).
std::string plan_calibrate_target(const std::vector<std::string>& args);
// `meshlm plan --calibrate FILE` (app/calibrate.cpp): collective over `job`.
int cmd_plan_calibrate(MPI_Comm job, const std::string& path);

}  // namespace meshlm
