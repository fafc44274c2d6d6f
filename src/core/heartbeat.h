// The progress of this process, as the stall watchdog sees it
// (comm/stall_watchdog.h): the monotonic clock's reading when a thread last
// moved the job on (a message completed, a step ended, a block of a
// checkpoint written). CLOCK_MONOTONIC is one clock for every process of a
// machine, so readings of the ranks of a node compare.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

namespace meshlm::heartbeat {

inline int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline std::atomic<int64_t>& last() {
  static std::atomic<int64_t> t{now_ns()};
  return t;
}

// Progress now (any thread; one relaxed store).
inline void beat() { last().store(now_ns(), std::memory_order_relaxed); }
inline int64_t last_ns() { return last().load(std::memory_order_relaxed); }

}  // namespace meshlm::heartbeat
