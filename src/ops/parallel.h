// Work splitting for the CPU ops.
#pragma once

#include <omp.h>

#include <utility>

namespace meshlm::ops {

// Inside an OpenMP parallel region: this thread's contiguous share [begin, end)
// of [0, n). Used where threads own a slice of the channels and loop over
// rows, so that reductions over rows need no atomics and run in a fixed order.
inline std::pair<int, int> thread_range(int n) {
  int nt = omp_get_num_threads(), id = omp_get_thread_num();
  int chunk = n / nt, rem = n % nt;
  int begin = id * chunk + (id < rem ? id : rem);
  return {begin, begin + chunk + (id < rem ? 1 : 0)};
}

}  // namespace meshlm::ops
