// Wall-clock timers per section of a training step. Sections are a fixed enum
// so that the end-of-run table has the same rows on every rank and can be
// reduced (min/avg/max) across ranks without exchanging names.
#pragma once

#include <string>

#include <array>
#include <chrono>

namespace meshlm {

enum class Section : int {
  forward, backward, tp_comm, pp_comm, dp_comm, optimizer, data, checkpoint, other, count
};
const char* section_name(Section s);

// The current UTC time as ISO 8601, "2026-11-24T03:22:10Z" (files' creation stamps).
std::string utc_timestamp();

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Sections nest: while an inner section runs (tensor-parallel communication
// inside a forward), the outer one is paused, so every second is booked once.
// A communication section books the time the rank spends issuing and
// waiting for its operations: the exposed part. Operations that run while
// the rank computes (the DP reduction overlapped with the backward) book
// their hidden part apart (add_hidden), outside the sections' sum.
class SectionTimers {
public:
  void add(Section s, double seconds) { total_[static_cast<int>(s)] += seconds; }
  void begin(Section s) {
    const double now = now_seconds();
    if (depth_ > 0) add(stack_[depth_ - 1], now - mark_);
    if (depth_ < kMaxDepth) stack_[depth_++] = s;
    mark_ = now;
  }
  void end() {
    const double now = now_seconds();
    if (depth_ > 0) add(stack_[--depth_], now - mark_);
    mark_ = now;
  }
  double total(Section s) const { return total_[static_cast<int>(s)]; }
  // Seconds during which operations of communication section `s` were in
  // flight while the rank did other work (no wait of its own).
  void add_hidden(Section s, double seconds) { hidden_[static_cast<int>(s)] += seconds; }
  double hidden(Section s) const { return hidden_[static_cast<int>(s)]; }
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
  static constexpr int kMaxDepth = 8;
  std::array<double, static_cast<int>(Section::count)> total_{}, hidden_{};
  std::array<Section, kMaxDepth> stack_{};
  int depth_ = 0;
  double mark_ = 0;
};

// Adds the lifetime of the scope to one section.
class ScopedTimer {
public:
  ScopedTimer(SectionTimers& t, Section s) : t_(t) { t_.begin(s); }
  ~ScopedTimer() { t_.end(); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

private:
  SectionTimers& t_;
};

}  // namespace meshlm
