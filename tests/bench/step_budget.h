// meshlm_bench --budget 1: where one CPU training step's time goes, op class
// by op class, against the machine's own rates measured in the same run (an
// SGEMM and a memory copy on the same threads), so that every change shows
// what it moved (docs/PERFORMANCE.md, "CPU step: the time budget").
#pragma once

#include <cstdio>
#include <string>

#include "ops/timed_kernels.h"

namespace meshlm::bench {

struct MachineRates {
  double sgemm_gflops = 0;  // cblas_sgemm of 2048^3, best of 5
  double copy_gbs = 0;      // a copy of 256 MiB over the threads, bytes read + written, best of 5
};

// Measures the two rates on the threads already set (OpenMP and OpenBLAS);
// the benchmark measures before and after its steps and keeps the better.
MachineRates measure_machine();

// Minor page faults of this process so far (getrusage).
long minor_faults();

// The budget of `steps` timed steps of `step_ms` each (median), from the
// op timer (reset after the warmup): a table on `out` and the same figures
// as a JSON object (returned, for the benchmark's line).
std::string print_budget(std::FILE* out, const ops::TimedKernels& timed, int steps, double step_ms,
                         double faults_per_step, const MachineRates& m);

}  // namespace meshlm::bench
