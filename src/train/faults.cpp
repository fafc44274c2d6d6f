#include "train/faults.h"

#include <csignal>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace meshlm::debug {

void Faults::in_forward(int step) const {
  if (d_.fail_rank >= 0 && d_.fail_rank == rank_ && d_.fail_step == step)
    throw RankError("failure injected by debug.fail_rank = " + std::to_string(d_.fail_rank) +
                        " at step " + std::to_string(step),
                    MESHLM_HERE);
}

bool Faults::poisons_gradients(int step) const {
  return d_.nan_step > 0 && step >= d_.nan_step && step < d_.nan_step + d_.nan_count && rank_ == 0;
}

void Faults::in_checkpoint(int64_t step, const char* point) const {
  if (!d_.kill_in_checkpoint.empty() && d_.kill_in_checkpoint == point && d_.kill_step == step &&
      d_.kill_rank == rank_) {
    std::fflush(nullptr);
    ::raise(SIGKILL);
  }
}

}  // namespace meshlm::debug
