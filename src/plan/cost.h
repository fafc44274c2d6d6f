// The planner's cost model: an estimate of one optimizer step's time for a
// layout, from the work each rank does and the bytes it sends, at stated
// rates (docs/planner.md). Pure arithmetic: no MPI, nothing allocated.
//
//   stage     a micro-batch's forward and backward on each stage, alone on
//             its rank's compute units, op class by op class:
//               GEMMs: 2 FLOPs per parameter and token forward, 4 backward
//               (2 under LoRA), the classifier's V C per token on the last
//               stage, divided by tp, at `flops_per_s` times the efficiency
//               of B x T rows; the classifier's backward (and the
//               cross-entropy's) runs in the last stage's forward, a chunk
//               of rows at a time as the logits are made;
//               attention: 4 B T^2 C forward and 8 backward per layer / tp, at
//               its own rate by head size (or as GEMMs);
//               GELU per element of (B T, 4C / tp), LayerNorm and residual
//               per element of (B T, C) (two per layer, not divided by tp),
//               the cross-entropy per logit of (B T, V / tp), at their
//               nanoseconds per element (0: inside `flops_per_s`);
//               under activation checkpointing the backward runs the
//               blocks' forward again; under ZeRO 2 the last stage runs
//               the classifier's forward and the cross-entropy's backward
//               again (wte's gradient in blocks of rows); tp's 2 all-reduces of (B, T, C) per
//               layer each way (ring: 2 (tp - 1) / tp of the bytes at the
//               group's bandwidth, 2 (tp - 1) latencies);
//   pipeline  the schedule run as it runs (plan/pipeline_schedule.h): each
//             stage's forwards and backwards in its order, each waiting for
//             the neighbour's send (the (B, T, C / tp) activations at the
//             group's bandwidth); ranks of a node share its units
//             (`units_per_node`), each using at most its own
//             (`units_per_rank`), so a rank that waits leaves its units to
//             the node's busy ranks where they have threads to use them;
//   optimizer AdamW and the gradient norm over the rank's updated elements;
//   dp        ZeRO 0 and 1: the gradients' reduction once per step, 2 (dp -
//             1) / dp of the rank's trained elements (ZeRO 1 as a
//             reduce-scatter and an all-gather), not overlapped; ZeRO 2: a
//             reduce-scatter's bytes for every micro-batch at the rate of
//             its reductions to owners (each layer's gradients as the
//             backward makes them, waited for there, a reduction's latency
//             per layer and edge; ClusterRates::zero2_reduce_fraction) and
//             the all-gather once.
//             With StepWork::overlap_dp (a device backend's communicators,
//             on a stream of their own: the NCCL path), the reductions run
//             while the backward goes on (dp_overlap below): ZeRO 0 and 1
//             reduce the last micro-batch's gradients in buckets of whole
//             layers of at least bucket_bytes as its backward finishes them
//             (ZeRO 1 reduce-scatters; its all-gather after the update stays
//             exposed), ZeRO 2 each layer of every micro-batch at the link's
//             reduce-scatter rate; one link, one bucket at a time. `dp` is
//             then the exposed part, `dp_hidden` what ran under the
//             backward. With StepWork::host_staged (device buffers through
//             the host, comm.device = host) nothing overlaps and every
//             group's bytes also cross to the host and back.
// A group's bandwidth is the node's when all its ranks share a node (ranks
// are numbered tp fastest, then dp, then pp; at most the node's memory
// bandwidth shared by its ranks' copies), the network's otherwise.
#pragma once

#include <functional>
#include <span>
#include <utility>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "model/gpt_config.h"
#include "model/gpt_options.h"
#include "plan/parallel_config.h"
#include "plan/partition.h"

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
  int gpus_per_node = 0;  // a device backend's GPUs per node
  std::string runtime_per_rank, runtime_pss_per_rank, device_runtime;  // sizes, as [memory]'s
  // Resolved by resolve_run_config; 0 = the rates file's or the preset's.
  uint64_t runtime_bytes = 0, runtime_pss_bytes = 0, device_runtime_bytes = 0;
};

// The ops outside GEMMs, per rank alone on its units: nanoseconds per
// element (0: inside ClusterRates::flops_per_s, as on the GPU presets).
struct OpClassRates {
  double gelu_forward_ns = 0, gelu_backward_ns = 0;  // per element of (B T, 4C)
  double norm_forward_ns = 0, norm_backward_ns = 0;  // per element of (B T, C), per LayerNorm
  double xent_forward_ns = 0, xent_backward_ns = 0;  // per logit
  double adamw_ns = 0;                               // per updated element, with the norm
  // The attention's products' FLOP/s by head size, (head size, FLOP/s)
  // increasing; between them linear in log(head size), beyond them the
  // nearest. Empty: at the GEMMs' rate.
  std::vector<std::pair<double, double>> attention_forward, attention_backward;
  std::vector<std::pair<double, double>> flash_forward, flash_backward;
};

// What a cluster does per rank and between ranks.
struct ClusterRates {
  double flops_per_s = 50e9;      // one rank's GEMM rate alone on its units
  double intra_bytes_per_s = 5e9;  // between two ranks of a node
  double intra_latency_s = 2e-6;
  double inter_bytes_per_s = 10e9;  // between nodes
  double inter_latency_s = 5e-6;
  int ranks_per_node = 1;
  // A node's memory bandwidth (bytes read and written per second, all its
  // cores): within a node a message is copied twice through shared memory,
  // 4 bytes of traffic per byte sent, and the node's ranks reduce at once,
  // so a group within a node gets at most this / (4 x its node's ranks).
  // 0: no bound (a GPU's links are its own).
  double node_memory_bytes_per_s = 0;
  // The compute units a node's ranks share (a CPU's cores; one GPU per rank)
  // and the most one rank uses (its threads): a rank with k busy ranks on
  // its node runs at min(1, units_per_node / (k units_per_rank)) of its rate,
  // times sharing_efficiency.
  // units_per_node 0: one per rank, never shared.
  int units_per_node = 0, units_per_rank = 1;
  // The fraction of their share that two or more busy ranks of a node get,
  // by busy ranks x units_per_rank / units_per_node: (ratio, fraction)
  // pairs read as efficiency_by_rows. Empty: 1.
  std::vector<std::pair<double, double>> sharing_efficiency;
  // A rank that waits for a message keeps polling its share of the units
  // (Open MPI's waits on the CPU spin): it counts as busy all step long.
  bool waiting_ranks_poll = false;
  // ZeRO 2's reduction of a micro-batch's gradients to their owners, layer
  // by layer in the backward (the owners' adds, the messages, the buckets'
  // zeroing and the waits for the partner's backward between them): 2 (dp -
  // 1) / dp of the gradients' bytes at this multiple of the dp group's
  // bandwidth. 2: a reduce-scatter's bytes at the link's rate; a calibration
  // measures it (its zero2_reduce_gbps against the bandwidth of 2 ranks).
  double zero2_reduce_fraction = 2;
  // Host staging of device buffers (comm.device = host): every byte a group
  // moves is copied from its GPU to the host and back at this rate, in
  // series with the link (comm/staged_comm.h).
  double host_copy_bytes_per_s = 10e9;
  // The GEMM rate's fraction by the rows of a micro-batch (B x T): (rows,
  // fraction) pairs, rows increasing; between them the fraction follows
  // log(rows) linearly, beyond them it is the nearest pair's. Empty: 1.
  std::vector<std::pair<double, double>> efficiency_by_rows;
  // Where known, the fraction by rows and width (the model's C): (width,
  // (rows, fraction) pairs) pairs, widths increasing, read as
  // efficiency_by_rows at each width and then between widths the same way.
  std::vector<std::pair<double, std::vector<std::pair<double, double>>>> efficiency_by_width;
  OpClassRates ops;
};

// The fraction of ClusterRates::flops_per_s that GEMMs of `rows` rows of a
// model of width `width` reach.
double gemm_efficiency(const ClusterRates& rates, double rows, double width);

// A table of (x, y) pairs, x increasing, read at `x`: linear in log(x)
// between pairs, the nearest pair's y beyond them; `empty` when there are none.
double log_interpolate(const std::vector<std::pair<double, double>>& table, double x, double empty);

// What a layout's ranks run in a step, besides its shape.
struct StepWork {
  int micro_batch = 1, seq_len = 1;
  bool lora = false;  // the base is frozen: no weight gradients
  Attention attention = Attention::probabilities;
  double reduced_bytes = 0;   // the gradients a rank reduces over dp each step
  double updated_elements = 0;  // the elements a rank's AdamW updates each step
  // The DP reduction overlapped with the backward (see dp above), in buckets
  // of at least bucket_bytes (comm.bucket_mb).
  bool overlap_dp = false;
  double bucket_bytes = 32.0 * (1 << 20);
  // Device buffers staged through the host (comm.device = host, or auto
  // where ranks share a GPU): each link's bytes also cross to the host and
  // back at ClusterRates::host_copy_bytes_per_s; nothing overlaps.
  bool host_staged = false;
};

struct StepCost {
  double compute = 0;   // the slowest stage's m forwards and backwards, its node's ranks all busy
  double pipeline = 0;  // the schedule's length beyond compute, tp and pp: its bubble, less the
                        // units waiting ranks give to busy ones (may be negative then)
  double tp = 0;         // the slowest stage's all-reduces
  double pp = 0;         // the sends of the first forward down the pipe and the last backward up
  double optimizer = 0, dp = 0;  // dp: the exposed part of the DP communication
  // The DP communication that ran under the backward (StepWork::overlap_dp);
  // without the overlap the step would take about this much longer.
  double dp_hidden = 0;
  std::vector<double> stage_seconds;  // each stage's forward and backward of one micro-batch, alone
  double total() const { return compute + pipeline + tp + pp + optimizer + dp; }
};

// The DP reduction of one stage's rank overlapped with its backward: the
// backward of one micro-batch takes `backward` seconds over `layers` layers,
// each layer's gradients (`block_bytes` in all) ready as it finishes, in the
// reverse order of the layers, and `edge_bytes` (the first stage's token
// embedding, whose gradient the lookup's backward makes last) at its end.
// `micro_batches` backwards run back to back; `each_micro_batch` (ZeRO 2)
// reduces every one's gradients layer by layer, else (ZeRO 0 and 1) only the
// last one's, in buckets of whole layers of at least `bucket_bytes` (the
// last bucket with the edge). One link, one bucket at a time: `seconds(b)`
// is a bucket of b bytes. Returns (exposed, hidden): the link's time after
// the last backward ends, and its time before.
std::pair<double, double> dp_overlap(double backward, int layers, double block_bytes,
                                     double edge_bytes, int micro_batches, bool each_micro_batch,
                                     double bucket_bytes,
                                     const std::function<double(double bytes)>& seconds);

// The estimated step of `p` (micro_batches resolved) with `stage_layers`
// layers per stage.
StepCost estimate_step(const GPTConfig& model, const ParallelConfig& p,
                       const std::vector<int>& stage_layers, const StepWork& w,
                       const ClusterRates& rates);

// The seconds of one micro-batch's forward and backward on a stage, alone on
// its units, as estimate_step counts them (tp's all-reduces included), split
// the way balance_stages reads a stage: per layer, and the classifier's part
// on the last stage (its LayerNorm, logits and cross-entropy; under ZeRO 2
// its second pass). The embedding's lookup is not in the model: 0. The
// planner balances stages by these where the FLOPs of gpt_stage_costs leave
// out what is not a GEMM (on a CPU they weigh: the mid model of
// docs/history/planner-2026-11.md spent 0.48 s of a 2.2 s step in GELU
// against 1.20 s in GEMMs).
StageCosts stage_time_costs(const GPTConfig& model, const ParallelConfig& p, const StepWork& w,
                            const ClusterRates& rates);

// The length of one step's pipeline schedule: stage s's forward and backward
// of a micro-batch take forward[s] and backward[s] at full speed, a send
// between neighbours `send` seconds; `ranks_per_stage` ranks run stage s on
// node `node[s]` (its replicas over dp and tp, in step with it), and the
// ranks of a node share `rates`' units.
double simulate_pipeline(PipelineSchedule kind, int micro_batches, const std::vector<double>& forward,
                         const std::vector<double>& backward, double send,
                         const std::vector<int>& node, int ranks_per_stage, const ClusterRates& rates);

// True when the ranks [first, first + count * stride) by `stride` share a node.
bool on_one_node(int first, int count, int stride, int ranks_per_node);

}  // namespace meshlm
