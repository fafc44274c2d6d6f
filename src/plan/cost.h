// The planner's cost model: an estimate of one optimizer step's time for a
// layout, from the work each rank does and the bytes it sends, at stated
// rates (docs/planner.md). Pure arithmetic: no MPI, nothing allocated.
//
//   compute   per micro-batch and stage: the stage's GEMM FLOPs (6 per
//             parameter and token, the attention's 12 B T^2 C per layer, the
//             classifier's 6 V C per token on the last stage), divided by tp,
//             plus a forward again under activation checkpointing, at
//             `flops_per_s` per rank times the efficiency of B x T rows;
//   pipeline  (m + pp - 1) slots of the slowest stage's micro-batch (1F1B and
//             GPipe alike: the same bubble, different memory);
//   tp        4 all-reduces of the (B, T, C) activations per layer and
//             micro-batch (2 forward, 2 backward), ring: 2 (tp - 1) / tp of
//             the bytes at the group's bandwidth, 2 (tp - 1) latencies;
//   pp        2 sends of (B, T, C) per micro-batch and stage boundary, on the
//             path of each of the (m + pp - 1) slots;
//   dp        the gradients' reduction once per step, 2 (dp - 1) / dp of the
//             rank's trained elements (ZeRO 1 and 2 move the same bytes as a
//             reduce-scatter and an all-gather), not overlapped.
// A group's bandwidth is the node's when all its ranks share a node (ranks
// are numbered tp fastest, then dp, then pp), the network's otherwise.
#pragma once

#include <span>
#include <utility>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "model/gpt_config.h"
#include "plan/parallel_config.h"

namespace meshlm {

// [cluster] cluster.preset: the figures a plan starts from.
enum class ClusterPreset {
  automatic,  // cpu_node on the CPU backend, h100_ib on CUDA
  cpu_node,   // this kind of machine: CPU ranks sharing a node's cores, shared memory
  h100_ib,    // 8 H100 GPUs per node, NVLink within, InfiniBand NDR (400 Gb/s per GPU) between
};
inline constexpr EnumName<ClusterPreset> kClusterPresetNames[] = {
    {ClusterPreset::automatic, "auto"},
    {ClusterPreset::cpu_node, "cpu-node"},
    {ClusterPreset::h100_ib, "h100-ib"},
};
constexpr std::span<const EnumName<ClusterPreset>> enum_names(ClusterPreset) {
  return kClusterPresetNames;
}

// [cluster]: what the planner assumes of the machines (docs/planner.md). A
// value of 0 (or "") takes the figure of `rates` when that file has it,
// else the preset's.
struct ClusterConfig {
  ClusterPreset preset = ClusterPreset::automatic;
  std::string rates;  // a file of `meshlm plan --calibrate`
  double gflops_per_rank = 0;
  double intra_node_gbps = 0, inter_node_gbps = 0;
  double intra_node_latency_us = 0, inter_node_latency_us = 0;
  std::string runtime_per_rank, runtime_pss_per_rank, device_runtime;  // sizes, as [memory]'s
  // Resolved by resolve_run_config; 0 = the rates file's or the preset's.
  uint64_t runtime_bytes = 0, runtime_pss_bytes = 0, device_runtime_bytes = 0;
};

// What a cluster does per rank and between ranks.
struct ClusterRates {
  double flops_per_s = 50e9;      // one rank's GEMM rate (fp32 on the CPU, its threads)
  double intra_bytes_per_s = 5e9;  // between two ranks of a node
  double intra_latency_s = 2e-6;
  double inter_bytes_per_s = 10e9;  // between nodes
  double inter_latency_s = 5e-6;
  int ranks_per_node = 1;
  // The GEMM rate's fraction by the rows of a micro-batch (B x T): (rows,
  // fraction) pairs, rows increasing; between them the fraction follows
  // log(rows) linearly, beyond them it is the nearest pair's. Empty: 1.
  std::vector<std::pair<double, double>> efficiency_by_rows;
};

// The fraction of ClusterRates::flops_per_s that GEMMs of `rows` rows reach.
double gemm_efficiency(const ClusterRates& rates, double rows);

struct StepCost {
  double compute = 0, pipeline_bubble = 0, tp = 0, pp = 0, dp = 0;
  std::vector<double> stage_seconds;  // each stage's compute for one micro-batch
  double total() const { return compute + pipeline_bubble + tp + pp + dp; }
};

// The estimated step of `p` (micro_batches resolved) training micro-batches
// of (micro_batch, seq_len) with `stage_layers` layers per stage; `lora`:
// the base is frozen (no weight gradients); `reduced_bytes`: the gradients
// a rank reduces over dp each step (its trained elements * 4).
StepCost estimate_step(const GPTConfig& model, const ParallelConfig& p,
                       const std::vector<int>& stage_layers, int micro_batch, int seq_len,
                       bool lora, double reduced_bytes, const ClusterRates& rates);

// True when the ranks [first, first + count * stride) by `stride` share a node.
bool on_one_node(int first, int count, int stride, int ranks_per_node);

}  // namespace meshlm
