// The layout planner's search (docs/planner.md): every layout of a job's
// ranks that the run accepts (dp x tp x pp, ZeRO stage, micro-batch size and
// count, activation checkpointing, pipeline schedule, stage split), each
// rank's memory as `meshlm train` predicts it (train/trainer.h) and the
// step's time by the cost model (plan/cost.h). `meshlm plan` prints it;
// `parallel.layout = auto` trains with its first fitting layout. Pure
// arithmetic on one process: no MPI, nothing large allocated.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mesh/mesh.h"
#include "plan/memory.h"
#include "plan/cost.h"
#include "train/group_paths.h"
#include "train/report.h"
#include "train/run_config.h"

namespace meshlm {

// The machines a plan is for.
struct PlanMachine {
  int ranks = 1, ranks_per_node = 1;
  ComputeBackend backend = ComputeBackend::cpu;
  int gpus_per_node = 0;  // a device backend's; rank r computes on GPU (r mod ranks_per_node) mod this
  int threads_per_rank = 1;  // a rank's OpenMP threads when runtime.threads = 0 (cores / G, at least 1)
  uint64_t mem_per_rank = 0;       // process (cpu) or device (cuda) peak; 0 = no limit
  uint64_t host_mem_per_node = 0;  // the node's ranks together; 0 = no limit
  uint64_t runtime = 0, runtime_pss = 0, device_runtime = 0;  // outside meshlm's buffers
  uint64_t windows = 0;  // the data's training windows (their shuffled order is memory)
  ClusterRates rates;
  std::string rates_source;  // where the rates come from, for the report
};

// The machine of `cluster` (the run's [cluster]) for `ranks` ranks, G per
// node, on `backend`: the preset's figures, replaced by those of
// cluster.rates (a file of `meshlm plan --calibrate`) and then by the
// section's nonzero keys. A CPU rank's GEMM rate is the node's (cores x the
// per-core rate, or the file's all-core rate) / G. RankError naming
// cluster.rates when that file cannot be read or is not one of --calibrate.
// `wait` is the run's comm.wait: a CPU pipeline's waiting ranks keep their
// cores under poll, and give them away under sleep and auto.
PlanMachine plan_machine(const ClusterConfig& cluster, ComputeBackend backend, int ranks,
                         int ranks_per_node, comm::WaitPolicy wait);

// The limits of a plan for a run with [memory] `mem`: `mem_per_rank` and
// `host_mem_per_node` when nonzero, else memory.limit_per_rank and
// limit_per_node, else on the CPU this node's physical memory / G per rank
// (none per rank on CUDA) and the node's memory per node. Returns where the
// limit per rank comes from, for the report.
std::string apply_memory_limits(PlanMachine& m, const MemoryConfig& mem, uint64_t mem_per_rank = 0,
                                uint64_t host_mem_per_node = 0);

// The training windows of data.path (their shuffled order is memory); 0
// when the file is not there. RankError naming it when it is not a token
// file (io::TokenReader).
uint64_t data_windows(const DataConfig& data, int seq_len);

// `meshlm plan --calibrate`: the JSON it writes (one object) has
// "what": kCalibrateWhat; anything else is not replaced.
inline constexpr const char* kCalibrateWhat = "meshlm plan --calibrate";

// What one rank of a layout holds at its peak.
struct PlannedRank {
  int rank = 0, node = 0;
  MeshCoords c;
  MemoryByCategory table{};  // the run's per-category prediction (host and device added)
  size_t peak = 0;           // against mem_per_rank: process (cpu) or device (cuda) peak
  size_t node_part = 0;      // its part of the node's host memory
  MemPhase peak_phase = MemPhase::training;
};

struct PlannedLayout {
  RunConfig cfg;
  std::vector<int> stages;
  std::vector<PlannedRank> ranks;
  size_t worst = 0, node_worst = 0;
  int worst_rank = 0, worst_node = 0;
  std::vector<size_t> stage_peak;  // the largest rank peak of each pipeline stage
  StepCost cost;
  std::string overflow;  // empty: fits
  // A device backend's path for the groups of rank 0 (comm.device
  // resolved): "nccl", or "host" when one of them stages through the host;
  // "" on the CPU.
  std::string device_comm;
};

// That path for `cfg` on `m`: CollectiveError when comm.device = nccl and
// two ranks of one of rank 0's groups (tp, dp, pp) share a GPU.
std::string device_comm_of(const RunConfig& cfg, const PlanMachine& m);
// The paths of rank `rank`'s groups for `cfg` on `m`, as train resolves
// them (train/group_paths.h): rank r on node r / ranks_per_node, on GPU
// (r mod ranks_per_node) mod gpus_per_node there. CollectiveError as above.
GroupPaths planned_group_paths(const RunConfig& cfg, const PlanMachine& m, int rank);
// ... of every rank at once (element r: rank r's), each group resolved once.
std::vector<GroupPaths> planned_every_rank_group_paths(const RunConfig& cfg, const PlanMachine& m);

// The memory and time of the resolved layout `cfg` on `m`.
PlannedLayout evaluate_layout(const RunConfig& cfg, const PlanMachine& m);

// The [parallel] values the search must keep (parallel.layout = auto with a
// key given explicitly); unset = searched.
struct LayoutConstraints {
  std::optional<int> dp, tp, pp, zero_stage, micro_batches;
  std::optional<Checkpointing> activation_checkpointing;
  std::optional<PipelineSchedule> schedule;
};

struct LayoutSearch {
  std::vector<PlannedLayout> fits, rejected;  // each fastest first
  int refused_count = 0;               // layouts the run would refuse
  std::map<std::string, int> refused;  // why: how many
};

// Every layout of m.ranks ranks for the run `base` (its [parallel] set
// aside, `constraints` kept). `checked_as`: the backend the run's rules are
// checked for (the file's; a plan may be for another). `progress(done,
// total)`, when given, is called after each accepted layout is evaluated.
LayoutSearch search_layouts(const RunConfig& base, ComputeBackend checked_as, const PlanMachine& m,
                            const LayoutConstraints& constraints = {},
                            const std::function<void(size_t, size_t)>& progress = {});

// A `progress` for search_layouts: once a search has taken a second, a line
// per tenth of the layouts evaluated (core/progress.h, on world rank 0),
// for a job of `ranks` ranks; each search starts a bar of its own.
std::function<void(size_t, size_t)> search_progress(int ranks);

// "dp2 tp1 pp2 zero1 B4x2 ckpt 1f1b"
std::string describe_layout(const RunConfig& c);

// max / min of the values (1 when empty or the least is 0).
double max_over_min(const std::vector<double>& v);

}  // namespace meshlm
