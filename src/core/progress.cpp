#include "core/progress.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdio>

#include "core/log.h"
#include "core/timer.h"

namespace meshlm {

ProgressBar::ProgressBar(std::string what, size_t total)
    : what_(std::move(what)), total_(std::max<size_t>(total, 1)), start_(now_seconds()) {
  active_ = log::rank() == 0;
}

void ProgressBar::update(size_t done, const std::string& detail) {
  if (!active_ || finished_) return;
  done = std::min(done, total_);
  const double frac = static_cast<double>(done) / static_cast<double>(total_);
  const int decile = static_cast<int>(frac * 10);
  // One line per decile, once the work has taken a second (short work stays
  // quiet); the last line is finish()'s.
  const double elapsed = now_seconds() - start_;
  if (elapsed < kQuietSeconds && !(printed_ && detail == "done")) return;
  if (decile == last_decile_ || (done == total_ && detail != "done")) return;
  printed_ = true;
  last_decile_ = decile;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(frac * kWidth);
  const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
  const std::string line = fmt::format("# {} [{}] {:3.0f}% {:.1f} s {}", what_, bar, 100 * frac,
                                       elapsed, detail);
  fmt::print(stdout, "{}\n", line);
  std::fflush(stdout);
}

void ProgressBar::finish() {
  if (!active_ || finished_) return;
  last_decile_ = -1;
  update(total_, "done");
  finished_ = true;
}

}  // namespace meshlm
