// End-of-run tables: memory per category and time per section, each reduced
// over the ranks of `comm` to min / avg / max (LAMMPS-style), printed by
// rank 0. Collective over `comm`.
#pragma once

#include <mpi.h>

#include <string>

#include "core/alloc.h"
#include "core/timer.h"

namespace meshlm {

void print_memory_table(const MemoryByCategory& predicted, MPI_Comm comm);
// `timers` should account for the whole run (SectionTimers::account_rest_as_other).
void print_timing_table(const SectionTimers& timers, double total_seconds, MPI_Comm comm);

// "12.3 MiB"
std::string format_bytes(double bytes);

}  // namespace meshlm
