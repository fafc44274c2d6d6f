// Learning-rate schedule: linear warmup, then cosine decay to a floor.
//   step < W:  lr * (step + 1) / W
//   else:      lr_min + 0.5 (1 + cos(pi * (step - W) / max(1, S - W))) (lr - lr_min)
// with step = 0 .. S-1 (S = train.steps, W = train.warmup_steps) and
// lr_min = lr * train.lr_min_ratio.
#pragma once

#include <algorithm>
#include <cmath>

namespace meshlm {

struct LRSchedule {
  double lr = 3e-4;
  double lr_min_ratio = 0.1;
  int warmup_steps = 0;
  int total_steps = 1;

  double at(int step) const {
    if (step < warmup_steps) return lr * (step + 1) / warmup_steps;
    const double lr_min = lr * lr_min_ratio;
    const double progress =
        static_cast<double>(step - warmup_steps) / std::max(1, total_steps - warmup_steps);
    const double p = std::min(1.0, progress);
    return lr_min + 0.5 * (1.0 + std::cos(M_PI * p)) * (lr - lr_min);
  }
};

}  // namespace meshlm
