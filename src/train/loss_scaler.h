// Dynamic loss scaling for train.precision = fp16 (as torch.cuda.amp's
// GradScaler does it). fp16 ends at 65504 and has no values below 2^-24, so
// small gradients of activations would flush to zero: the loss is multiplied
// by a scale S before backward, every gradient comes out S times larger, and
// it is divided by S again before the optimizer sees it.
//
//   * A step whose scaled gradients are not all finite has overflowed: it is
//     skipped (nothing is updated), counted and logged, and S halves.
//   * After `window` steps in a row without overflow S doubles, up to kMax.
//   * Once S has halved below kMin the gradients are not finite at any
//     scale: the model has diverged, and the run ends (exhausted()).
//
// Under fp32 and bf16 the scale is 1 and never changes.
#pragma once

#include <algorithm>

namespace meshlm {

// train.loss_scale, train.loss_scale_window
struct LossScaleConfig {
  double initial = 65536.0;  // 2^16
  int window = 2000;
};

class LossScaler {
public:
  static constexpr double kMax = 4294967296.0;  // 2^32
  static constexpr double kMin = 1.0 / 16777216.0;  // 2^-24

  LossScaler(bool enabled, const LossScaleConfig& c)
      : enabled_(enabled), scale_(enabled ? c.initial : 1.0), window_(c.window) {}

  bool enabled() const { return enabled_; }
  // The scale of the next step's backward.
  double scale() const { return scale_; }
  int overflows() const { return overflows_; }
  bool exhausted() const { return scale_ < kMin; }
  int good_in_a_row() const { return good_in_a_row_; }
  // A resumed run continues from a checkpoint's scale and count.
  void restore(double scale, int good_in_a_row) {
    if (!enabled_) return;
    scale_ = scale;
    good_in_a_row_ = good_in_a_row;
  }

  // After a step whose scaled gradients overflowed: halve.
  void overflowed() {
    ++overflows_;
    good_in_a_row_ = 0;
    scale_ /= 2.0;
  }
  // After a step that was applied: maybe double.
  void applied() {
    if (!enabled_) return;
    if (++good_in_a_row_ >= window_) {
      good_in_a_row_ = 0;
      scale_ = std::min(scale_ * 2.0, kMax);
    }
  }

private:
  bool enabled_;
  double scale_;
  int window_;
  int good_in_a_row_ = 0;
  int overflows_ = 0;
};

}  // namespace meshlm
