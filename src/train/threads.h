// OpenMP and BLAS threads of each rank.
//
// runtime.threads = 0 (automatic): a rank runs as many threads as the cores
// of its CPU affinity mask, shared among the ranks of its host whose masks
// overlap it:
//
//     threads = max(1, |mask| / #{ranks on the host whose mask meets mine})
//
// So `mpiexec -n 1` bound to one core runs 1 thread (not one per core of
// the machine, all on that core), `--bind-to none` gives that rank every
// core, 8 ranks bound one core each get 1 thread each, and 4 unbound ranks
// on 16 cores get 4 each. runtime.threads = N runs N threads; a rank whose
// mask has fewer cores than N is named in a warning (its threads would
// share cores), and N above kMaxThreadsPerCore per core of the mask is an
// error naming runtime.threads.
#pragma once

#include "core/cpu_set.h"
#include "mesh/mesh.h"

namespace meshlm {

// runtime.threads may ask for at most this many threads per core of the
// rank's affinity mask; more can only slow it down.
inline constexpr int kMaxThreadsPerCore = 4;

struct RankThreads {
  int threads = 1;
  CpuSet cores;     // this rank's affinity mask
  int sharers = 1;  // ranks of the host whose mask overlaps this one's, itself included
};

// True when the ranks whose masks overlap this one's run more threads than
// its mask has cores (threads x sharers > |mask|): they take turns on them.
// comm.wait = auto sleeps in its waits then (comm/comm.h).
bool shares_cores(const RankThreads& t);

// The rule above, for the masks of every rank of one host (pure arithmetic).
RankThreads threads_for(int requested, const CpuSet& mine, const std::vector<CpuSet>& host_masks);

// Collective over mesh.world(): gathers the masks of mesh.host(), applies
// the rule, sets the OpenMP and OpenBLAS thread counts of this rank, and has
// rank 0 warn about every rank asked to run more threads than it has cores.
RankThreads configure_threads(int requested, const ProcessMesh& mesh);

}  // namespace meshlm
