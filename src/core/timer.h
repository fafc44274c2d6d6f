// Wall-clock timers per section of a training step. Sections are a fixed enum
// so that the end-of-run table has the same rows on every rank and can be
// reduced (min/avg/max) across ranks without exchanging names.
#pragma once

#include <array>
#include <chrono>

namespace meshlm {

enum class Section : int { forward, backward, optimizer, data, checkpoint, other, count };
const char* section_name(Section s);

class SectionTimers {
public:
  void add(Section s, double seconds) { total_[static_cast<int>(s)] += seconds; }
  double total(Section s) const { return total_[static_cast<int>(s)]; }
  double sum() const {
    double s = 0;
    for (double t : total_) s += t;
    return s;
  }
  // Books whatever part of `wall_seconds` no section has timed as "other".
  void account_rest_as_other(double wall_seconds) {
    const double rest = wall_seconds - sum();
    if (rest > 0) add(Section::other, rest);
  }

private:
  std::array<double, static_cast<int>(Section::count)> total_{};
};

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Adds the lifetime of the scope to one section.
class ScopedTimer {
public:
  ScopedTimer(SectionTimers& t, Section s) : t_(t), s_(s), start_(now_seconds()) {}
  ~ScopedTimer() { t_.add(s_, now_seconds() - start_); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

private:
  SectionTimers& t_;
  Section s_;
  double start_;
};

}  // namespace meshlm
