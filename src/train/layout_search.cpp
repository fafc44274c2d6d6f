#include "train/layout_search.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "comm/device_comm.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/tokens.h"
#include "plan/memory.h"
#include "plan/partition.h"
#include "plan/rank_plan.h"
#include "train/backend.h"
#include "train/trainer.h"

namespace meshlm {

namespace {

using nlohmann::json;

struct Preset {
  double gflops_per_core = 0;  // cpu-node: one core's; a rank's threads add theirs
  double gflops_per_rank = 0;  // h100-ib: per GPU
  double intra_gbps, inter_gbps, intra_us, inter_us;
  uint64_t runtime, runtime_pss, device_runtime;
  int gpus_per_node = 0;
};

// This project's 2-core development VM (meshlm plan --calibrate, 2026-11-24:
// sgemm 195 GFLOP/s on one core).
constexpr Preset kCpuNode{195, 0, 5, 10, 2, 5, 40u << 20, 25u << 20, 600u << 20};
// OpenBLAS's sgemm by rows on this project's 2-core development VM
// (meshlm plan --calibrate, 2026-11-24: 125, 180 and 196 GFLOP/s at 64, 256
// and 1024 rows of 1024 x 1024).
const std::vector<std::pair<double, double>> kCpuRows = {{64, 0.64}, {256, 0.92}, {1024, 1.0}};
// meshlm's own bf16 step on one H100 (docs/PERFORMANCE.md: 124M at 137 000
// tokens/s, 6 x 124M FLOPs a token: 1.0e14 FLOP/s); NVLink 4 as NCCL's
// all-reduce sees it; NDR InfiniBand, one 400 Gb/s port per GPU.
constexpr Preset kH100Ib{0, 103e3, 300, 50, 3, 5, 512u << 20, 512u << 20, 600u << 20, 8};
// The rate's fraction by the rows of a micro-batch on one H100: meshlm's
// bf16 step of GPT-2 124M with flash attention at B = 1 .. 32 sequences of
// 1024 (meshlm_bench, 2026-11-24: 46.5, 63.9, 79.3, 90.9, 97.3 and 102.9
// TFLOP/s; docs/PERFORMANCE.md); GPT-2 1.5B at B = 1 reaches 0.51 of its own
// largest, the same curve.
const std::vector<std::pair<double, double>> kH100Rows = {
    {1024, 0.45}, {2048, 0.62}, {4096, 0.77}, {8192, 0.88}, {16384, 0.95}, {32768, 1.0}};

// The ops outside GEMMs on one core of the same VM (meshlm plan --calibrate,
// 2026-11-24): ns per element, and the attention's FLOP/s by head size.
const OpClassRates kCpuOps = {9.68, 11.03, 1.35, 1.57, 2.13, 2.12, 1.74,
                              {{32, 42.5e9}, {64, 63.5e9}, {128, 98.3e9}},
                              {{32, 96.3e9}, {64, 119.6e9}, {128, 147.6e9}},
                              {{32, 48.2e9}, {64, 75.2e9}, {128, 106.5e9}},
                              {{32, 79.7e9}, {64, 104.5e9}, {128, 124.0e9}}};

using Table = std::vector<std::pair<double, double>>;
using WidthTable = std::vector<std::pair<double, Table>>;

// A rate of `threads` of a node's `cores` from one core's and all cores'
// (0: unknown, then `threads` times one core's): linear in the threads.
double at_threads(double one, double all, int threads, int cores) {
  if (all <= 0 || cores <= 1) return one * threads;
  const int t = std::min(threads, cores);
  return one + (all - one) * (t - 1) / (cores - 1);
}

// The same for the figures of the ops outside GEMMs (`all` null: unknown).
OpClassRates ops_at_threads(const OpClassRates& one, const OpClassRates* all, int threads, int cores) {
  OpClassRates r = one;
  auto ns = [&](double OpClassRates::*f) {
    r.*f = 1.0 / at_threads(1.0 / (one.*f), all ? 1.0 / (all->*f) : 0, threads, cores);
  };
  for (auto f : {&OpClassRates::gelu_forward_ns, &OpClassRates::gelu_backward_ns,
                 &OpClassRates::norm_forward_ns, &OpClassRates::norm_backward_ns,
                 &OpClassRates::xent_forward_ns, &OpClassRates::xent_backward_ns,
                 &OpClassRates::adamw_ns})
    ns(f);
  for (auto f : {&OpClassRates::attention_forward, &OpClassRates::attention_backward,
                 &OpClassRates::flash_forward, &OpClassRates::flash_backward})
    for (size_t i = 0; i < (r.*f).size(); ++i)
      (r.*f)[i].second = at_threads((one.*f)[i].second,
                                    all && i < (all->*f).size() ? (all->*f)[i].second : 0, threads, cores);
  return r;
}

double positive(const json& j, const char* key) {
  const double v = j.at(key).get<double>();
  if (!(v > 0)) throw std::runtime_error(std::string(key) + " is not positive");
  return v;
}

// A --calibrate object `j` (named `what` in errors) of number keys, each at
// least `least_key` and above 0, to positive values: its (key, value x
// scale) pairs, keys increasing.
Table number_table(const json& j, const std::string& what, double least_key, double scale = 1) {
  Table t;
  for (const auto& [k, v] : j.items()) {
    t.emplace_back(std::stod(k), v.get<double>() * scale);
    if (!(t.back().first >= least_key && t.back().first > 0 && t.back().second > 0))
      throw std::runtime_error(what + " has a bad entry " + k);
  }
  std::sort(t.begin(), t.end());
  return t;
}

// An "ops_one_core" or "ops_all_cores" object of a --calibrate file.
OpClassRates op_class_rates(const json& j) {
  OpClassRates o;
  o.gelu_forward_ns = positive(j, "gelu_forward_ns");
  o.gelu_backward_ns = positive(j, "gelu_backward_ns");
  o.norm_forward_ns = positive(j, "norm_forward_ns");
  o.norm_backward_ns = positive(j, "norm_backward_ns");
  o.xent_forward_ns = positive(j, "xent_forward_ns");
  o.xent_backward_ns = positive(j, "xent_backward_ns");
  o.adamw_ns = positive(j, "adamw_ns");
  auto table = [&](const char* key) { return number_table(j.at(key), key, 1, 1e9); };
  o.attention_forward = table("attention_forward_gflops_by_head_size");
  o.attention_backward = table("attention_backward_gflops_by_head_size");
  o.flash_forward = table("flash_attention_forward_gflops_by_head_size");
  o.flash_backward = table("flash_attention_backward_gflops_by_head_size");
  return o;
}

// The "matmul_gflops_by_width_and_rows" object of a --calibrate file, FLOP/s.
WidthTable matmul_rates(const json& j) {
  WidthTable w;
  for (const auto& [width, rows] : j.items()) {
    w.emplace_back(std::stod(width),
                   number_table(rows, "matmul_gflops_by_width_and_rows/" + width, 1, 1e9));
  }
  std::sort(w.begin(), w.end());
  return w;
}

}  // namespace

PlanMachine plan_machine(const ClusterConfig& k, ComputeBackend backend, int ranks,
                         int ranks_per_node, comm::WaitPolicy wait) {
  PlanMachine m;
  m.ranks = ranks;
  m.ranks_per_node = std::max(ranks_per_node, 1);
  m.backend = backend;
  const bool device = backend_caps(backend).device_memory;
  const ClusterPreset preset = k.preset != ClusterPreset::automatic
                                   ? k.preset
                                   : (device ? ClusterPreset::h100_ib : ClusterPreset::cpu_node);
  const Preset& p = preset == ClusterPreset::h100_ib ? kH100Ib : kCpuNode;
  const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  // The CPU's figures on one core, and on all (0 / empty: not known).
  double gflops_one = p.gflops_per_core, gflops_all = 0, rank_gflops = p.gflops_per_rank;
  OpClassRates ops_one = kCpuOps, ops_all;
  bool has_ops_all = false;
  WidthTable matmul_one, matmul_all;
  double intra = p.intra_gbps, inter = p.inter_gbps, intra_us = p.intra_us, inter_us = p.inter_us;
  double zero2_gbps = 0;    // a calibration's ZeRO 2 reductions
  bool zero2_intra = true;  // measured within a node (else between nodes)
  m.runtime = p.runtime;
  m.runtime_pss = p.runtime_pss;
  m.device_runtime = p.device_runtime;
  m.rates_source = std::string("preset ") + name_of(preset);
  m.rates.efficiency_by_rows = preset == ClusterPreset::h100_ib ? kH100Rows : kCpuRows;
  if (!k.rates.empty()) {
    std::ifstream in(k.rates);
    if (!in) throw RankError("cluster.rates = '" + k.rates + "': cannot read it", MESHLM_HERE);
    try {
      const json j = json::parse(in);
      if (j.value("what", std::string()) != kCalibrateWhat)
        throw std::runtime_error("its \"what\" is not \"" + std::string(kCalibrateWhat) + "\"");
      // A file of a CPU machine gives the CPU's figures; its MPI and memory
      // figures hold on either backend.
      if (!device) {
        gflops_one = positive(j, "gflops_per_core");
        gflops_all = positive(j, "gflops_all_cores");
      }
      if (!device && j.contains("gflops_all_cores_by_rows")) {
        // Relative to the largest: the fraction of the rate by rows.
        Table rows = number_table(j.at("gflops_all_cores_by_rows"), "gflops_all_cores_by_rows", 1);
        double best = 0;
        for (const auto& r : rows) best = std::max(best, r.second);
        for (auto& r : rows) r.second /= best;
        m.rates.efficiency_by_rows = rows;
      }
      if (j.contains("intra_node_gbps")) intra = positive(j, "intra_node_gbps");
      for (const char* where : {"intra_node", "inter_node"})
        if (const std::string key = std::string(where) + "_zero2_reduce_gbps"; j.contains(key)) {
          zero2_gbps = positive(j, key.c_str());
          zero2_intra = std::string(where) == "intra_node";
        }
      if (j.contains("intra_node_latency_us")) intra_us = positive(j, "intra_node_latency_us");
      if (j.contains("inter_node_gbps")) inter = positive(j, "inter_node_gbps");
      if (j.contains("inter_node_latency_us")) inter_us = positive(j, "inter_node_latency_us");
      if (!device && j.contains("ops_one_core") && j.contains("ops_all_cores")) {
        ops_one = op_class_rates(j.at("ops_one_core"));
        ops_all = op_class_rates(j.at("ops_all_cores"));
        has_ops_all = true;
        matmul_one = matmul_rates(j.at("ops_one_core").at("matmul_gflops_by_width_and_rows"));
        matmul_all = matmul_rates(j.at("ops_all_cores").at("matmul_gflops_by_width_and_rows"));
        if (matmul_one.size() != matmul_all.size())
          throw std::runtime_error("its matmul tables of one core and all cores differ in shape");
      }
      if (!device && j.contains("memory_gbps_all_cores"))
        m.rates.node_memory_bytes_per_s = positive(j, "memory_gbps_all_cores") * 1e9;
      if (!device && j.contains("sharing_efficiency_by_ranks_per_core"))
        m.rates.sharing_efficiency = number_table(j.at("sharing_efficiency_by_ranks_per_core"),
                                                  "sharing_efficiency_by_ranks_per_core", 0);
      if (!device && j.contains("runtime_bytes")) m.runtime = j.at("runtime_bytes").get<uint64_t>();
      if (!device && j.contains("runtime_pss_bytes"))
        m.runtime_pss = j.at("runtime_pss_bytes").get<uint64_t>();
    } catch (const std::exception& e) {
      throw RankError("cluster.rates = '" + k.rates + "' is not a file of meshlm plan --calibrate: " +
                          e.what(),
                      MESHLM_HERE);
    }
    m.rates_source += " and " + k.rates;
  }
  // A CPU rank runs on its threads (the node's cores / G, at least one):
  // its rates alone are those of that many cores, between one core's and
  // all cores'; the cost model shares the cores among the ranks busy at a
  // time. A GPU is a rank's own.
  const int threads = std::max(1, cores / m.ranks_per_node);
  m.threads_per_rank = threads;
  m.rates.units_per_node = device ? m.ranks_per_node : cores;
  m.rates.units_per_rank = device ? 1 : threads;
  // comm.wait = auto sleeps wherever the cores are shared, and where they
  // are not, polling takes nothing from anyone.
  m.rates.waiting_ranks_poll = !device && wait == comm::WaitPolicy::poll;
  if (!device) {
    rank_gflops = at_threads(gflops_one, gflops_all, threads, cores);
    m.rates.ops = ops_at_threads(ops_one, has_ops_all ? &ops_all : nullptr, threads, cores);
    // The linear layer's rate by width and rows, as a fraction of the rank's.
    for (size_t w = 0; w < matmul_one.size(); ++w) {
      Table t = matmul_one[w].second;
      for (size_t i = 0; i < t.size(); ++i)
        t[i].second = at_threads(t[i].second,
                                 i < matmul_all[w].second.size() ? matmul_all[w].second[i].second : 0,
                                 threads, cores) /
                      (rank_gflops * 1e9);
      m.rates.efficiency_by_width.emplace_back(matmul_one[w].first, t);
    }
  }
  // ZeRO 2's reductions as the calibration's 2 ranks ran them, against the
  // bandwidth the cost model gives a group of 2 ranks there (a node's: at
  // most its memory bandwidth / 8).
  if (zero2_gbps > 0) {
    double two = zero2_intra ? intra : inter;
    if (zero2_intra && m.rates.node_memory_bytes_per_s > 0)
      two = std::min(two, m.rates.node_memory_bytes_per_s / 1e9 / 8.0);
    m.rates.zero2_reduce_fraction = zero2_gbps / two;
  }
  if (k.gflops_per_rank > 0) rank_gflops = k.gflops_per_rank;
  if (k.intra_node_gbps > 0) intra = k.intra_node_gbps;
  if (k.inter_node_gbps > 0) inter = k.inter_node_gbps;
  if (k.intra_node_latency_us > 0) intra_us = k.intra_node_latency_us;
  if (k.inter_node_latency_us > 0) inter_us = k.inter_node_latency_us;
  if (k.runtime_bytes > 0) m.runtime = k.runtime_bytes;
  if (k.runtime_pss_bytes > 0) m.runtime_pss = k.runtime_pss_bytes;
  if (k.device_runtime_bytes > 0) m.device_runtime = k.device_runtime_bytes;
  m.rates.flops_per_s = rank_gflops * 1e9;
  m.rates.intra_bytes_per_s = intra * 1e9;
  m.rates.inter_bytes_per_s = inter * 1e9;
  m.rates.intra_latency_s = intra_us * 1e-6;
  m.rates.inter_latency_s = inter_us * 1e-6;
  m.rates.ranks_per_node = m.ranks_per_node;
  // The emulated device's GPUs: one per rank unless cluster.gpus_per_node
  // says (train/group_paths.h, emulated_device_ordinal).
  if (device)
    m.gpus_per_node = k.gpus_per_node > 0                      ? k.gpus_per_node
                      : backend_caps(m.backend).nccl_emulated ? m.ranks_per_node
                                                                : std::max(p.gpus_per_node, 1);
  return m;
}

std::string apply_memory_limits(PlanMachine& m, const MemoryConfig& mem, uint64_t mem_per_rank,
                                uint64_t host_mem_per_node) {
  const uint64_t machine = physical_memory_bytes();
  std::string from = mem_per_rank ? "--mem-per-rank" : "memory.limit_per_rank";
  m.mem_per_rank = mem_per_rank ? mem_per_rank : mem.rank_limit_bytes;
  if (m.mem_per_rank == 0 && !backend_caps(m.backend).device_memory) {
    m.mem_per_rank = machine / static_cast<uint64_t>(m.ranks_per_node);
    from = fmt::format("this node's memory / its {} ranks", m.ranks_per_node);
  }
  if (m.mem_per_rank == 0) from = "no limit: memory.limit_per_rank is not set";
  m.host_mem_per_node = host_mem_per_node ? host_mem_per_node : mem.node_limit_bytes;
  if (m.host_mem_per_node == 0) m.host_mem_per_node = machine;
  return from;
}

uint64_t data_windows(const DataConfig& data, int seq_len) {
  if (data.path.empty() || !std::filesystem::exists(data.path)) return 0;
  const io::TokenReader tokens = io::TokenReader::open(data.path);
  return tokens.size() > 0 ? (tokens.size() - 1) / static_cast<uint64_t>(seq_len) : 0;
}

namespace {

// Rank r (coordinates c) of the layout `cfg` on `o`.
PlannedRank plan_rank(const RunConfig& cfg, const PlanMachine& o, const MeshCoords& c, int r,
                      const GroupPaths& paths) {
  const bool device = backend_caps(o.backend).device_memory;
  PlannedRank m;
  m.rank = r;
  m.node = r / o.ranks_per_node;
  m.c = c;
  const RankPlan shape = rank_plan_at(cfg, m.c, r, r % o.ranks_per_node);
  const int threads = cfg.runtime.threads > 0 ? cfg.runtime.threads : o.threads_per_rank;
  const RunMemoryOptions mo = memory_options(cfg, o.windows, paths, threads);
  const PhasedMemory phased = predict_run_phases(cfg.model, shape, mo);
  m.table = predicted_categories(cfg.model, shape, mo, phased);
  if (device) {
    // Conservative: the table adds host and device; all of it is counted
    // against the device, and the host holds the runtime, the data's order,
    // the async snapshot and the node's quantized store.
    m.peak = o.device_runtime + total(m.table);
    m.node_part = o.runtime_pss + at(m.table, MemCategory::other) +
                  at(m.table, MemCategory::checkpoint) + shape.quantized_bytes;
  } else {
    size_t best = 0;
    for (int ph = 0; ph < kNumMemPhases; ++ph) {
      const MemPhase phase = static_cast<MemPhase>(ph);
      size_t t = phased.phase_total(phase);
      if (phase == MemPhase::training) t += shape.shared_read_bytes;
      if (t >= best) {
        best = t;
        m.peak_phase = phase;
      }
    }
    m.peak = o.runtime + best;
    m.node_part = o.runtime_pss + phased.peak();
  }
  return m;
}

// What a step of `cfg` computes per micro-batch, without its memory.
StepWork step_shape(const RunConfig& cfg) {
  StepWork w;
  w.micro_batch = cfg.train.micro_batch_size;
  w.seq_len = cfg.train.seq_len;
  w.lora = cfg.finetune.mode == FinetuneMode::lora;
  w.attention = cfg.train.attention;
  return w;
}

}  // namespace

namespace {

// Rank r of `m` on node r / ranks_per_node, GPU (r mod ranks_per_node) mod
// gpus_per_node there; a refusal, worked out from the configuration alone,
// the same on every rank.
template <typename F>
auto planned_paths(const PlanMachine& m, F&& resolve) {
  const int gpus = m.gpus_per_node > 0 ? m.gpus_per_node : m.ranks_per_node;
  try {
    return resolve([&m, gpus](int r) {
      return comm::GpuSlot{r / m.ranks_per_node, comm::gpu_of(r % m.ranks_per_node, gpus), r};
    });
  } catch (const RankError& e) {
    throw CollectiveError(e.what(), MESHLM_HERE);
  }
}

// "nccl", "host" (a group of two or more ranks of rank 0 staged) or "" (the
// CPU). (A group of one rank moves nothing, whichever its path.)
std::string device_comm_text(const RunConfig& cfg, const PlanMachine& m, const GroupPaths& rank0) {
  if (!backend_caps(m.backend).device_memory) return "";
  const ParallelConfig& p = cfg.parallel;
  const bool staged = (p.dp > 1 && !rank0.nccl(kGroupDp)) || (p.tp > 1 && !rank0.nccl(kGroupTp)) ||
                      (p.pp > 1 && !rank0.nccl(kGroupPp));
  return staged ? "host" : "nccl";
}

}  // namespace

GroupPaths planned_group_paths(const RunConfig& cfg, const PlanMachine& m, int rank) {
  return planned_paths(m, [&](const auto& slot_of) {
    return resolve_group_paths(m.backend, cfg.comm.device, cfg.parallel, rank, slot_of);
  });
}

std::vector<GroupPaths> planned_every_rank_group_paths(const RunConfig& cfg, const PlanMachine& m) {
  return planned_paths(m, [&](const auto& slot_of) {
    return resolve_every_rank_group_paths(m.backend, cfg.comm.device, cfg.parallel, slot_of);
  });
}

std::string device_comm_of(const RunConfig& cfg, const PlanMachine& m) {
  return device_comm_text(cfg, m, planned_group_paths(cfg, m, 0));
}

PlannedLayout evaluate_layout(const RunConfig& cfg, const PlanMachine& o) {
  PlannedLayout L;
  L.cfg = cfg;
  const std::vector<GroupPaths> paths = planned_every_rank_group_paths(cfg, o);
  L.device_comm = device_comm_text(cfg, o, paths.front());
  const ParallelConfig& p = cfg.parallel;
  L.stages = stage_layers(cfg.model, p, cfg.train.seq_len);
  const MeshLayout mesh(p.dp, p.tp, p.pp);
  std::map<int, size_t> node_sum;
  size_t trained = 0;
  for (int r = 0; r < o.ranks; ++r) {
    const PlannedRank m = plan_rank(cfg, o, mesh.coords(r), r, paths[static_cast<size_t>(r)]);
    trained = std::max(trained, at(m.table, MemCategory::grads));
    node_sum[m.node] += m.node_part;
    if (m.peak > L.worst) {
      L.worst = m.peak;
      L.worst_rank = r;
    }
    L.ranks.push_back(m);
  }
  L.stage_peak.assign(static_cast<size_t>(p.pp), 0);
  for (const PlannedRank& m : L.ranks)
    L.stage_peak[static_cast<size_t>(m.c.pp)] = std::max(L.stage_peak[static_cast<size_t>(m.c.pp)], m.peak);
  for (const auto& [node, bytes] : node_sum)
    if (bytes > L.node_worst) {
      L.node_worst = bytes;
      L.worst_node = node;
    }
  // The gradients a rank reduces: its trained elements (ZeRO 2 books a
  // bucket, not the whole; the reduction still moves all of them); the
  // elements its AdamW updates: its optimizer state / 2 floats.
  StepWork w = step_shape(cfg);
  w.reduced_bytes = static_cast<double>(trained);
  for (const PlannedRank& m : L.ranks)
    w.updated_elements =
        std::max(w.updated_elements, static_cast<double>(at(m.table, MemCategory::optimizer)) / 8);
  if (p.zero_stage == 2) w.reduced_bytes = w.updated_elements * 4 * p.dp;
  // A device backend's DP reduction runs on NCCL's stream under the
  // backward; the CPU's, and one staged through the host, are waited for
  // where they are issued.
  w.host_staged = L.device_comm == "host";
  w.overlap_dp = !L.device_comm.empty() && paths.front().nccl(kGroupDp);
  w.bucket_bytes = static_cast<double>(size_t(cfg.comm.bucket_mb) << 20);
  L.cost = estimate_step(cfg.model, p, L.stages, w, o.rates);
  if (o.mem_per_rank > 0 && L.worst > o.mem_per_rank) {
    const PlannedRank& w = L.ranks[static_cast<size_t>(L.worst_rank)];
    int big = 0;
    for (int c = 1; c < kNumMemCategories; ++c)
      if (w.table[static_cast<size_t>(c)] > w.table[static_cast<size_t>(big)]) big = c;
    L.overflow = fmt::format("rank {} (dp {} tp {} pp {}): {} > {} per rank by {} ({} the largest, {})",
                             w.rank, w.c.dp, w.c.tp, w.c.pp, format_bytes(double(L.worst)),
                             format_bytes(double(o.mem_per_rank)),
                             format_bytes(double(L.worst - o.mem_per_rank)),
                             mem_category_name(static_cast<MemCategory>(big)),
                             format_bytes(double(w.table[static_cast<size_t>(big)])));
  } else if (o.host_mem_per_node > 0 && L.node_worst > o.host_mem_per_node) {
    L.overflow = fmt::format("node {}: {} of host memory > {} per node by {}", L.worst_node,
                             format_bytes(double(L.node_worst)), format_bytes(double(o.host_mem_per_node)),
                             format_bytes(double(L.node_worst - o.host_mem_per_node)));
  }
  return L;
}

namespace {

// n's divisors, ascending: pairs (k, n / k) for k up to sqrt(n), in 64-bit
// arithmetic (k * k of an int near 2^31 would overflow an int).
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (long long k = 1; k * k <= n; ++k)
    if (n % k == 0) {
      low.push_back(static_cast<int>(k));
      if (k * k != n) high.push_back(static_cast<int>(n / k));
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// The stage costs the planner splits `c`'s pipeline by: the cost model's
// seconds (plan/cost.h stage_time_costs), at its micro-batch and rates.
StageCosts planned_stage_costs(const RunConfig& c, const PlanMachine& m) {
  return stage_time_costs(c.model, c.parallel, step_shape(c), m.rates);
}

// `c` (pp > 1, no stage_layers given) with the split that minimises its
// slowest stage's estimated time, when that is not the split meshlm train
// makes by FLOPs alone, and the layout then fits as well and is estimated
// faster.
std::optional<PlannedLayout> split_by_time(const RunConfig& c, const PlanMachine& m, const PlannedLayout& L) {
  const std::vector<int> split = balance_stages(c.model.n_layer, c.parallel.pp, planned_stage_costs(c, m));
  if (split == L.stages) return std::nullopt;
  RunConfig t = c;
  t.parallel.stage_layers.layers = split;
  PlannedLayout out = evaluate_layout(t, m);
  const bool loses_fit = L.overflow.empty() && !out.overflow.empty();
  if (loses_fit || out.cost.total() >= L.cost.total()) return std::nullopt;
  return out;
}

// The pipeline split of `c` (pp > 1, no stage_layers given) that minimises
// the slowest stage among those whose every stage fits m.mem_per_rank, when
// it is not the split `L` has and the layout then fits.
std::optional<PlannedLayout> split_under_memory(const RunConfig& c, const PlanMachine& m,
                                                const PlannedLayout& L) {
  const int n_layer = c.model.n_layer, p = c.parallel.pp;
  const MeshLayout mesh(c.parallel.dp, c.parallel.tp, p);
  const std::vector<GroupPaths> paths = planned_every_rank_group_paths(c, m);
  // Stage k with n layers: the largest peak of its ranks; the other stages
  // share the rest (their layers do not change stage k's memory).
  const StageFits fits = [&](int k, int n) {
    RunConfig t = c;
    std::vector<int>& layers = t.parallel.stage_layers.layers;
    layers.assign(static_cast<size_t>(p), 0);
    layers[static_cast<size_t>(k)] = n;
    for (int j = 0, left = n_layer - n; j < p; ++j)
      if (j != k) {
        const int others = p - 1 - (j > k ? j - 1 : j);
        layers[static_cast<size_t>(j)] = (left + others - 1) / others;
        left -= layers[static_cast<size_t>(j)];
      }
    for (int r = 0; r < m.ranks; ++r) {
      const MeshCoords rc = mesh.coords(r);
      if (rc.pp == k && plan_rank(t, m, rc, r, paths[static_cast<size_t>(r)]).peak > m.mem_per_rank)
        return false;
    }
    return true;
  };
  const std::vector<int> split = balance_stages(n_layer, p, planned_stage_costs(c, m), fits);
  if (split.empty() || split == L.stages) return std::nullopt;
  RunConfig t = c;
  t.parallel.stage_layers.layers = split;
  PlannedLayout out = evaluate_layout(t, m);
  if (!out.overflow.empty()) return std::nullopt;
  return out;
}

// The split of `c` (as split_under_memory) whose node sum fits
// m.host_mem_per_node too, when `L`'s does not: a node's sum changes with
// the split through its stages' in-flight activations, which no stage's
// peak alone tells. Splits under a per-rank bound lowered in steps of 5% of
// L's worst rank, the first that fits both limits.
std::optional<PlannedLayout> split_under_node_memory(const RunConfig& c, const PlanMachine& m,
                                                     const PlannedLayout& L) {
  constexpr int kSteps = 10;
  PlanMachine bounded = m;
  for (int i = 1; i <= kSteps; ++i) {
    const size_t bound = L.worst - L.worst / 20 * static_cast<size_t>(i);
    bounded.mem_per_rank = m.mem_per_rank > 0 ? std::min(m.mem_per_rank, bound) : bound;
    bounded.host_mem_per_node = 0;  // split_under_memory's own evaluation: the per-rank bound only
    const std::optional<PlannedLayout> split = split_under_memory(c, bounded, L);
    if (!split) continue;
    PlannedLayout out = evaluate_layout(split->cfg, m);
    if (out.overflow.empty()) return out;
  }
  return std::nullopt;
}

template <typename T>
bool allowed(const std::optional<T>& fixed, const T& v) {
  return !fixed || *fixed == v;
}

}  // namespace

LayoutSearch search_layouts(const RunConfig& base, ComputeBackend checked_as, const PlanMachine& m,
                            const LayoutConstraints& k,
                            const std::function<void(size_t, size_t)>& progress) {
  LayoutSearch s;
  const int batch = base.train.batch_size;
  // First the layouts the run accepts (its own checks, cheap).
  std::vector<RunConfig> accepted;
  for (int tp : divisors(m.ranks))
    for (int pp : divisors(m.ranks / tp)) {
      const int dp = m.ranks / (tp * pp);
      if (batch % dp != 0 || !allowed(k.dp, dp) || !allowed(k.tp, tp) || !allowed(k.pp, pp)) continue;
      for (int mbs : divisors(batch / dp))
        for (int zero : {0, 1, 2})
          for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
            for (PipelineSchedule sched : {PipelineSchedule::one_f_one_b, PipelineSchedule::gpipe}) {
              if (dp == 1 && zero > 0 && !k.zero_stage) continue;  // ZeRO shards over dp: the same as 0
              if (pp == 1 && sched == PipelineSchedule::gpipe && !k.schedule) continue;
              if (!allowed(k.micro_batches, batch / dp / mbs) ||
                  !allowed(k.zero_stage, zero) || !allowed(k.activation_checkpointing, ck) ||
                  !allowed(k.schedule, sched))
                continue;
              RunConfig c = base;
              c.runtime.backend = checked_as;
              c.parallel.layout = LayoutChoice::manual;
              c.parallel.dp = dp;
              c.parallel.tp = tp;
              c.parallel.pp = pp;
              c.parallel.zero_stage = zero;
              c.parallel.micro_batches = 0;
              c.parallel.activation_checkpointing = ck;
              c.parallel.schedule = sched;
              if (pp != base.parallel.pp) c.parallel.stage_layers = {};
              c.train.micro_batch_size = mbs;
              try {
                resolve_run_config(c, m.ranks);
                device_comm_of(c, m);
              } catch (const Error& e) {
                // The reason without the source location.
                std::string why = e.what();
                if (const size_t at = why.rfind(" ("); at != std::string::npos && why.back() == ')')
                  why.resize(at);
                ++s.refused[why];
                ++s.refused_count;
                continue;
              }
              c.runtime.backend = m.backend;
              accepted.push_back(std::move(c));
            }
    }
  // Then each accepted layout's memory, rank by rank, and time.
  for (size_t i = 0; i < accepted.size(); ++i) {
    const RunConfig& c = accepted[i];
    PlannedLayout L = evaluate_layout(c, m);
    const bool free_split = c.parallel.pp > 1 && c.parallel.stage_layers.layers.empty();
    if (free_split)
      if (std::optional<PlannedLayout> split = split_by_time(c, m, L)) L = std::move(*split);
    if (!L.overflow.empty() && free_split && m.mem_per_rank > 0 && L.worst > m.mem_per_rank)
      if (std::optional<PlannedLayout> split = split_under_memory(c, m, L)) L = std::move(*split);
    if (!L.overflow.empty() && free_split && m.host_mem_per_node > 0 &&
        L.node_worst > m.host_mem_per_node)
      if (std::optional<PlannedLayout> split = split_under_node_memory(c, m, L)) L = std::move(*split);
    (L.overflow.empty() ? s.fits : s.rejected).push_back(std::move(L));
    if (progress) progress(i + 1, accepted.size());
  }
  auto faster = [](const PlannedLayout& a, const PlannedLayout& b) {
    if (a.cost.total() != b.cost.total()) return a.cost.total() < b.cost.total();
    return a.worst < b.worst;
  };
  std::stable_sort(s.fits.begin(), s.fits.end(), faster);
  std::stable_sort(s.rejected.begin(), s.rejected.end(), faster);
  return s;
}

std::function<void(size_t, size_t)> search_progress(int ranks) {
  auto bar = std::make_shared<std::optional<ProgressBar>>();
  return [bar, ranks](size_t done, size_t total) {
    if (!*bar)
      bar->emplace(fmt::format("layout search: {} layouts of {} ranks", total, ranks), total);
    (*bar)->update(done);
    if (done == total) {
      (*bar)->finish();
      bar->reset();
    }
  };
}

std::string describe_layout(const RunConfig& c) {
  const ParallelConfig& p = c.parallel;
  std::string s = fmt::format("dp{} tp{} pp{} zero{} B{}x{}", p.dp, p.tp, p.pp, p.zero_stage,
                              c.train.micro_batch_size, p.micro_batches);
  if (p.activation_checkpointing == Checkpointing::full) s += " ckpt";
  if (p.pp > 1) s += std::string(" ") + name_of(p.schedule);
  return s;
}

double max_over_min(const std::vector<double>& v) {
  if (v.empty()) return 1;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *lo > 0 ? *hi / *lo : 1;
}

}  // namespace meshlm
