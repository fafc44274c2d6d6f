// End-of-run tables: memory per category and time per section, each reduced
// over the ranks of `world` to min / avg / max (LAMMPS-style), printed by
// rank 0. Collective over `world`.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "ops/timed_kernels.h"

namespace meshlm {

// One rank's process-level prediction: the runtime's part (resident memory
// outside the tracked buffers, measured at start-up) and each phase's
// predicted tracked host total (plan/memory.h, PhasedMemory).
struct ProcessPrediction {
  size_t runtime = 0;
  // The runtime's part in proportional terms (PSS outside the tracked
  // buffers, at the same moment): a library page that k ranks map counts
  // 1/k on each, so the ranks of a node add up to the node's memory.
  size_t runtime_pss = 0;
  std::array<size_t, kNumMemPhases> phases{};
  // Pages of the node's shared base store, which another rank holds, that
  // this rank reads in training (load::store_pages_read).
  size_t shared = 0;
  int node = 0;  // the node's index (ProcessMesh::node_index)
  size_t peak() const;  // runtime + the largest phase (training's with `shared`)
};

// The memory of each node, predicted: over the phases, the largest sum over
// the node's ranks of runtime_pss + the phase's tracked total. The shared
// base counts once (in its holder's quantized category; `shared` is not
// added), as the node's summed PSS counts it. Index = node index.
std::vector<size_t> predicted_node_peaks(const std::vector<ProcessPrediction>& ranks);

// One rank's memory at the end of a run.
struct RankMemory {
  MemoryByCategory predicted{}, current{}, peak{};
  ProcessMemory process;
  ProcessPrediction expected;
  std::array<size_t, kNumMemPhases> phase_peak{};  // measured by the tracker, host
  double error() const;  // (expected.peak() - VmHWM) / VmHWM; 0 without /proc
};
// Per node (index = node index), from its ranks' figures: how many, their
// runtime PSS summed, the predicted peak (predicted_node_peaks) and their
// PSS at the end summed.
struct NodeMemory {
  int ranks = 0;
  size_t runtime_pss = 0, predicted = 0, pss = 0;
};
std::vector<NodeMemory> node_memory(const std::vector<RankMemory>& ranks);
// Collective over `world`: every rank's figures (its prediction, the tracked
// allocator, host and GPU buffers together per category, /proc) on rank 0,
// in rank order; empty on the other ranks.
std::vector<RankMemory> gather_memory(const MemoryByCategory& predicted,
                                      const ProcessPrediction& expected, comm::Communicator& world);
// Collective over `world`: one line before the run, the predicted total per
// rank as min / avg / max, and rank 0's largest categories.
void print_predicted_memory(const MemoryByCategory& predicted, comm::Communicator& world);
// Rank 0: per category predicted and measured peak, min / avg / max over the
// ranks; then one line per rank (labels[r], e.g. its mesh coordinates) with
// its measured peaks. Prints nothing elsewhere.
void print_memory_table(const std::vector<RankMemory>& ranks,
                        const std::vector<std::string>& labels);
// `timers` should account for the whole run (SectionTimers::account_rest_as_other).
// runtime.op_timings: seconds and calls of every op that ran, min / avg /
// max over ranks, and the average per optimizer step. Collective.
void print_op_timing_table(const ops::TimedKernels& ops, int steps, comm::Communicator& world);

void print_timing_table(const SectionTimers& timers, double total_seconds,
                        comm::Communicator& world);

// "12.3 MiB"
std::string format_bytes(double bytes);

}  // namespace meshlm
