// A progress bar for long work on rank 0 (quantizing a model, writing a
// cache): one line per 10%. It is never redrawn in place: under mpiexec
// stdout is a pseudo-terminal even when it ends in a job's output file, and
// a log must not fill with carriage returns.
#pragma once

#include <cstddef>
#include <string>

namespace meshlm {

class ProgressBar {
public:
  // Prints only on world rank 0 (like log::info).
  ProgressBar(std::string what, size_t total);
  // `done` of total units; `detail` is shown after the figures (a tensor name).
  void update(size_t done, const std::string& detail = "");
  void finish();  // the final 100% line

private:
  std::string what_;
  size_t total_ = 1;
  double start_ = 0;
  int last_decile_ = -1;
  bool finished_ = false, active_ = false, printed_ = false;
  static constexpr double kQuietSeconds = 1.0;
};

}  // namespace meshlm
