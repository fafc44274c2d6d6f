#include "app/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string_view>

#include <boost/program_options.hpp>

#include "app/parameter_file.h"
#include "core/enum_names.h"
#include "core/error.h"
#include "io/tokens.h"
#include "mesh/mesh.h"
#include "ops/blas.h"
#include "plan/cost.h"
#include "plan/memory.h"
#include "plan/rank_plan.h"
#include "train/report.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace meshlm {

namespace {

namespace po = boost::program_options;
using nlohmann::json;

const char* const kUsage =
    "usage: meshlm plan FILE.cfg --ranks N --ranks-per-node G [options] [--section.key=value ...]\n"
    "\n"
    "The layouts of N ranks (dp x tp x pp, ZeRO stage, micro-batch size and count,\n"
    "activation checkpointing, pipeline schedule) that fit the memory limits, ranked\n"
    "by the estimated step time, without running anything (docs/planner.md). Each\n"
    "layout's memory is the prediction meshlm train makes for it, rank by rank.\n"
    "Prints the configured layout's per-rank prediction, the layouts that fit (the\n"
    "fastest first) and the fastest rejected ones with the rank and category that\n"
    "overflow. --section.key=value overrides a key of FILE.cfg as in meshlm train.\n";

struct Options {
  std::string file;
  int ranks = 0, ranks_per_node = 0, top = 10;
  uint64_t mem_per_rank = 0, host_mem_per_node = 0;
  std::optional<ComputeBackend> backend;
  bool json = false;
  std::string calibrate, rates_file;
  uint64_t runtime = 0, runtime_pss = 0, device_runtime = 0;
  ClusterRates rates;
  std::vector<std::string> overrides;
};

uint64_t machine_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

Options parse_options(const std::vector<std::string>& args, bool help_only = false) {
  Options o;
  std::vector<std::string> mine;
  for (const std::string& a : args) {
    // "--section.key=value" overrides the parameter file; the rest is plan's.
    const std::string_view v(a);
    const std::string_view key = v.starts_with("--") ? v.substr(2, v.find('=') == v.npos ? v.npos : v.find('=') - 2) : std::string_view();
    if (key.find('.') != std::string_view::npos) o.overrides.push_back(a);
    else mine.push_back(a);
  }
  std::string mem_rank, mem_node, backend, runtime, runtime_pss, device_runtime;
  double gflops = 0, intra = 0, inter = 0, intra_us = 0, inter_us = 0;
  po::options_description d("options");
  d.add_options()
      ("ranks", po::value<int>(&o.ranks)->default_value(0), "ranks of the job (N); required")
      ("ranks-per-node", po::value<int>(&o.ranks_per_node)->default_value(0), "ranks on each node (G); N need not be a multiple; required")
      ("mem-per-rank", po::value<std::string>(&mem_rank)->default_value(""),
       "memory one rank may use: host memory on the CPU backend, device memory on cuda "
       "(e.g. 80GiB; default: this machine's memory / G on cpu, none on cuda)")
      ("host-mem-per-node", po::value<std::string>(&mem_node)->default_value(""),
       "host memory of a node, shared by its G ranks (default: this machine's memory)")
      ("backend", po::value<std::string>(&backend)->default_value(""), "cpu or cuda (default: runtime.backend of FILE.cfg)")
      ("runtime-per-rank", po::value<std::string>(&runtime)->default_value(""),
       "a rank's resident memory outside meshlm's buffers (code, libraries, MPI, heap; default 40MiB on cpu, measured 32-33 MiB; 512MiB of host on cuda)")
      ("runtime-pss-per-rank", po::value<std::string>(&runtime_pss)->default_value(""),
       "its part in the node's memory, shared pages split (default 25MiB on cpu, 512MiB on cuda)")
      ("device-runtime", po::value<std::string>(&device_runtime)->default_value(""),
       "device memory a CUDA rank holds outside meshlm's buffers (context, cuBLAS; default 600MiB, measured 597 MiB on an H100)")
      ("gflops-per-rank", po::value<double>(&gflops)->default_value(0),
       "one rank's GEMM rate in GFLOP/s (default on cpu: the node's rate from --rates, or 40 per core, / G; 100000 on cuda)")
      ("intra-node-gbps", po::value<double>(&intra)->default_value(0), "bandwidth between two ranks of a node, GB/s (default 5 on cpu, 300 on cuda)")
      ("inter-node-gbps", po::value<double>(&inter)->default_value(0), "bandwidth between nodes, GB/s (default 10 on cpu, 25 on cuda)")
      ("intra-node-latency-us", po::value<double>(&intra_us)->default_value(2), "latency of a message within a node, microseconds")
      ("inter-node-latency-us", po::value<double>(&inter_us)->default_value(5), "latency of a message between nodes, microseconds")
      ("top", po::value<int>(&o.top)->default_value(10), "layouts listed of each kind (fitting, rejected)")
      ("calibrate", po::value<std::string>(&o.calibrate)->default_value(""),
       "measure this machine's GEMM rate (one core, and all of them) and write it to this JSON file; nothing else")
      ("rates", po::value<std::string>(&o.rates_file)->default_value(""),
       "a file --calibrate wrote: the CPU rate per rank is its all-cores rate / G (the ranks of a node share its cores)")
      ("json", po::bool_switch(&o.json), "print JSON instead of tables");
  if (help_only) {
    std::ostringstream help;
    help << d;
    std::fputs(kUsage, stdout);
    std::fputs(("\n" + help.str()).c_str(), stdout);
    return o;
  }
  po::positional_options_description pos;
  pos.add("file", 1);
  po::options_description all;
  all.add(d).add_options()("file", po::value<std::string>(&o.file)->default_value(""), "parameter file");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(mine).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::ostringstream help;
    help << d;
    throw RankError(std::string("meshlm plan: ") + e.what() + "\n" + kUsage + "\n" + help.str(),
                    MESHLM_HERE);
  }
  if (!o.calibrate.empty()) return o;
  if (o.file.empty()) throw RankError("meshlm plan: no parameter file given\n" + std::string(kUsage), MESHLM_HERE);
  if (o.ranks < 1) throw RankError("meshlm plan: --ranks must be >= 1 (the job's ranks)", MESHLM_HERE);
  if (o.ranks_per_node < 1)
    throw RankError("meshlm plan: --ranks-per-node must be >= 1 (the ranks on each node)", MESHLM_HERE);
  if (o.top < 0) throw RankError("meshlm plan: --top must be >= 0", MESHLM_HERE);
  if (!backend.empty()) {
    o.backend = enum_from_name<ComputeBackend>(backend);
    if (!o.backend)
      throw RankError("meshlm plan: --backend '" + backend + "': use " +
                          enum_choices<ComputeBackend>(" or "),
                      MESHLM_HERE);
  }
  if (!mem_rank.empty()) o.mem_per_rank = parse_memory_size("--mem-per-rank", mem_rank);
  if (!mem_node.empty()) o.host_mem_per_node = parse_memory_size("--host-mem-per-node", mem_node);
  if (!runtime.empty()) o.runtime = parse_memory_size("--runtime-per-rank", runtime);
  if (!runtime_pss.empty()) o.runtime_pss = parse_memory_size("--runtime-pss-per-rank", runtime_pss);
  if (!device_runtime.empty()) o.device_runtime = parse_memory_size("--device-runtime", device_runtime);
  o.rates.flops_per_s = gflops * 1e9;
  o.rates.intra_bytes_per_s = intra * 1e9;
  o.rates.inter_bytes_per_s = inter * 1e9;
  o.rates.intra_latency_s = intra_us * 1e-6;
  o.rates.inter_latency_s = inter_us * 1e-6;
  for (double v : {gflops, intra, inter, intra_us, inter_us})
    if (v < 0) throw RankError("meshlm plan: rates and latencies must be >= 0", MESHLM_HERE);
  return o;
}

std::string read_parameter_file(const std::string& path) {
  std::string text, why;
  if (!read_parameter_text(path, text, why))
    throw RankError("meshlm plan: cannot read parameter file '" + path + "'" + why, MESHLM_HERE);
  return text;
}

// GFLOP/s of single-precision GEMMs of 1024 x 1024 x 1024 on `threads`
// threads: the best of 5 after one warm-up.
double gemm_gflops(int threads) {
  ops::set_threads(threads);
  constexpr int n = 1024;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n, 0.0f);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    ops::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, dt);
  }
  return 2.0 * n * n * n / best / 1e9;
}

constexpr const char* kCalibrateWhat = "meshlm plan --calibrate: sgemm 1024^3 (OpenBLAS), best of 5";

int calibrate(const std::string& path) {
  // Only a file of --calibrate is replaced.
  if (std::filesystem::exists(path)) {
    bool ours = false;
    try {
      std::ifstream in(path);
      ours = json::parse(in).at("what").get<std::string>() == kCalibrateWhat;
    } catch (const std::exception&) {
    }
    if (!ours)
      throw RankError("meshlm plan: --calibrate '" + path +
                          "' exists and is not a file of --calibrate: not replaced",
                      MESHLM_HERE);
  }
  const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  const double one = gemm_gflops(1), all = gemm_gflops(cores);
  const json j = {{"gflops_per_core", one}, {"gflops_all_cores", all}, {"cores", cores},
                  {"what", kCalibrateWhat}};
  std::ofstream out(path + ".tmp");
  out << j.dump(2) << "\n";
  out.close();
  if (!out || std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
    std::remove((path + ".tmp").c_str());
    throw RankError("meshlm plan: cannot write '" + path + "'", MESHLM_HERE);
  }
  fmt::print("# meshlm plan --calibrate: {:.1f} GFLOP/s on one core, {:.1f} on all {} -> {}\n", one,
             all, cores, path);
  return 0;
}

double all_cores_gflops(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw RankError("meshlm plan: --rates '" + path + "': cannot read it", MESHLM_HERE);
  try {
    const json j = json::parse(in);
    const double v = j.at("gflops_all_cores").get<double>();
    if (!(v > 0)) throw std::runtime_error("gflops_all_cores is not positive");
    return v;
  } catch (const std::exception& e) {
    throw RankError("meshlm plan: --rates '" + path + "' is not a file of --calibrate: " + e.what(),
                    MESHLM_HERE);
  }
}

// What one rank of a layout holds at its peak.
struct PlannedRank {
  int rank = 0, node = 0;
  MeshCoords c;
  MemoryByCategory table{};  // the run's per-category prediction (host and device added)
  size_t peak = 0;           // against --mem-per-rank: process (cpu) or device (cuda) peak
  size_t node_part = 0;      // its part of the node's host memory
  MemPhase peak_phase = MemPhase::training;
};

struct Layout {
  RunConfig cfg;
  std::vector<int> stages;
  std::vector<PlannedRank> ranks;
  size_t worst = 0, node_worst = 0;
  int worst_rank = 0, worst_node = 0;
  std::vector<size_t> stage_peak;  // the largest rank peak of each pipeline stage
  StepCost cost;
  std::string overflow;  // empty: fits
};

std::string describe(const RunConfig& c) {
  const ParallelConfig& p = c.parallel;
  std::string s = fmt::format("dp{} tp{} pp{} zero{} B{}x{}", p.dp, p.tp, p.pp, p.zero_stage,
                              c.train.micro_batch_size, p.micro_batches);
  if (p.activation_checkpointing == Checkpointing::full) s += " ckpt";
  if (p.pp > 1) s += std::string(" ") + name_of(p.schedule);
  return s;
}

std::string stages_text(const std::vector<int>& v) {
  return fmt::format("{}", fmt::join(v, ","));
}

// The memory of every rank of the layout `cfg` (resolved for o.ranks).
Layout evaluate(const RunConfig& cfg, const Options& o, uint64_t windows) {
  Layout L;
  L.cfg = cfg;
  const ParallelConfig& p = cfg.parallel;
  const bool cuda = cfg.runtime.backend == ComputeBackend::cuda;
  L.stages = stage_layers(cfg.model, p, cfg.train.seq_len);
  const MeshLayout mesh(p.dp, p.tp, p.pp);
  std::map<int, size_t> node_sum;
  size_t trained = 0;
  for (int r = 0; r < o.ranks; ++r) {
    PlannedRank m;
    m.rank = r;
    m.node = r / o.ranks_per_node;
    m.c = mesh.coords(r);
    const RankPlan shape = rank_plan_at(cfg, m.c, r, r % o.ranks_per_node);
    const PhasedMemory phased = predict_run_phases(cfg, shape, windows);
    m.table = predicted_categories(cfg, shape, phased);
    trained = std::max(trained, at(m.table, MemCategory::grads));
    if (cuda) {
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
  const bool lora = cfg.finetune.mode == FinetuneMode::lora;
  // The gradients a rank reduces: its trained elements (ZeRO 2 books a
  // bucket, not the whole; the reduction still moves all of them).
  double reduced = static_cast<double>(trained);
  if (p.zero_stage == 2) {
    reduced = 0;
    for (const PlannedRank& m : L.ranks)
      reduced = std::max(reduced, static_cast<double>(at(m.table, MemCategory::optimizer)) / 2 * p.dp);
  }
  L.cost = estimate_step(cfg.model, p, L.stages, cfg.train.micro_batch_size, cfg.train.seq_len,
                         lora, reduced, o.rates);
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

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(k);
  return d;
}

// max / min over the stages (1 with one stage).
template <typename T>
double spread(const std::vector<T>& v) {
  if (v.empty()) return 1;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *lo > 0 ? double(*hi) / double(*lo) : 1;
}

json layout_json(const Layout& L) {
  const ParallelConfig& p = L.cfg.parallel;
  json j = {{"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp}, {"zero_stage", p.zero_stage},
            {"micro_batch_size", L.cfg.train.micro_batch_size}, {"micro_batches", p.micro_batches},
            {"activation_checkpointing", name_of(p.activation_checkpointing)},
            {"schedule", name_of(p.schedule)}, {"stage_layers", L.stages},
            {"peak_bytes_max", L.worst}, {"peak_rank", L.worst_rank},
            {"node_bytes_max", L.node_worst},
            {"step_seconds", L.cost.total()},
            {"cost", {{"compute", L.cost.compute}, {"pipeline_bubble", L.cost.pipeline_bubble},
                      {"tp", L.cost.tp}, {"pp", L.cost.pp}, {"dp", L.cost.dp}}},
            {"stage_peak_bytes", L.stage_peak}, {"stage_seconds", L.cost.stage_seconds},
            {"stage_memory_max_over_min", spread(L.stage_peak)},
            {"stage_time_max_over_min", spread(L.cost.stage_seconds)},
            {"fits", L.overflow.empty()}};
  if (!L.overflow.empty()) j["overflow"] = L.overflow;
  return j;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  if (args.empty() || std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    parse_options(args, /*help_only=*/true);
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  Options o = parse_options(args);
  if (!o.calibrate.empty()) return calibrate(o.calibrate);
  // The file as one rank would run it (every key checked), and its layout
  // on o.ranks ranks, which may not be one the run accepts.
  const std::string text = read_parameter_file(o.file);
  std::optional<RunConfig> as_configured;
  std::string configured_error;
  try {
    as_configured = parse_run_config(text, o.file, o.overrides, o.ranks);
  } catch (const Error& e) {
    configured_error = e.what();
  }
  // Else the file on one rank, its [parallel] layout set aside (the search
  // sets it): every other key still checked.
  std::vector<std::string> one_rank = o.overrides;
  for (const char* k : {"--parallel.dp=1", "--parallel.tp=1", "--parallel.pp=1",
                        "--parallel.micro_batches=0", "--parallel.stage_layers="})
    one_rank.push_back(k);
  RunConfig base = as_configured ? *as_configured : parse_run_config(text, o.file, one_rank, 1);
  const ComputeBackend file_backend = base.runtime.backend;
  const ComputeBackend backend = o.backend ? *o.backend : file_backend;
  base.runtime.backend = backend;
  if (as_configured) as_configured->runtime.backend = backend;
  const bool cuda = base.runtime.backend == ComputeBackend::cuda;
  if (o.runtime == 0) o.runtime = cuda ? (512u << 20) : (40u << 20);
  if (o.runtime_pss == 0) o.runtime_pss = cuda ? (512u << 20) : (25u << 20);
  if (o.device_runtime == 0) o.device_runtime = 600u << 20;
  const uint64_t machine = machine_memory_bytes();
  if (o.host_mem_per_node == 0) o.host_mem_per_node = machine;
  if (o.mem_per_rank == 0 && !cuda) o.mem_per_rank = machine / static_cast<uint64_t>(o.ranks_per_node);
  o.rates.ranks_per_node = o.ranks_per_node;
  if (o.rates.flops_per_s == 0) {
    // The node's cores are shared by its G ranks (runtime.threads each).
    const double cores = static_cast<double>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
    const double node = o.rates_file.empty() ? 40e9 * cores : all_cores_gflops(o.rates_file) * 1e9;
    o.rates.flops_per_s = cuda ? 100e12 : node / o.ranks_per_node;
  }
  if (o.rates.intra_bytes_per_s == 0) o.rates.intra_bytes_per_s = cuda ? 300e9 : 5e9;
  if (o.rates.inter_bytes_per_s == 0) o.rates.inter_bytes_per_s = cuda ? 25e9 : 10e9;

  // The data's windows (the shuffled order is memory): from data.path when
  // it is there.
  uint64_t windows = 0;
  std::string data_note;
  if (!base.data.path.empty() && std::filesystem::exists(base.data.path)) {
    const io::TokenReader tokens = io::TokenReader::open(base.data.path);
    windows = tokens.size() > 0 ? (tokens.size() - 1) / static_cast<uint64_t>(base.train.seq_len) : 0;
  } else {
    data_note = "data.path '" + base.data.path + "' is not there: its shuffled order (other) is not counted";
  }

  std::optional<Layout> configured;
  if (as_configured) {
    const ParallelConfig& p = as_configured->parallel;
    if (static_cast<long long>(p.dp) * p.tp * p.pp != o.ranks)
      configured_error = fmt::format("parallel.dp {} x tp {} x pp {} is not {} ranks", p.dp, p.tp,
                                     p.pp, o.ranks);
    else
      configured = evaluate(*as_configured, o, windows);
  }

  // Every layout of o.ranks ranks the run would accept.
  std::vector<Layout> fits, rejected;
  int invalid = 0;
  std::map<std::string, int> refused;  // why the run would refuse a layout: how many
  const int batch = base.train.batch_size;
  for (int tp : divisors(o.ranks))
    for (int pp : divisors(o.ranks / tp)) {
      const int dp = o.ranks / (tp * pp);
      if (batch % dp != 0) continue;
      for (int mbs : divisors(batch / dp))
        for (int zero : {0, 1, 2})
          for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
            for (PipelineSchedule sched : {PipelineSchedule::one_f_one_b, PipelineSchedule::gpipe}) {
              if (dp == 1 && zero > 0) continue;  // ZeRO shards over dp: the same as 0
              if (pp == 1 && sched == PipelineSchedule::gpipe) continue;
              RunConfig c = base;
              c.runtime.backend = file_backend;  // checked as the file says; planned for `backend`
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
                resolve_run_config(c, o.ranks);
              } catch (const Error& e) {
                // The reason without the source location.
                std::string why = e.what();
                if (const size_t at = why.rfind(" ("); at != std::string::npos && why.back() == ')')
                  why.resize(at);
                ++refused[why];
                ++invalid;
                continue;
              }
              c.runtime.backend = backend;
              Layout L = evaluate(c, o, windows);
              (L.overflow.empty() ? fits : rejected).push_back(std::move(L));
            }
    }
  auto faster = [](const Layout& a, const Layout& b) {
    if (a.cost.total() != b.cost.total()) return a.cost.total() < b.cost.total();
    return a.worst < b.worst;
  };
  std::sort(fits.begin(), fits.end(), faster);
  std::sort(rejected.begin(), rejected.end(), faster);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (o.json) {
    json j = {{"model", {{"n_layer", base.model.n_layer}, {"n_head", base.model.n_head},
                         {"n_embd", base.model.n_embd}, {"vocab_size", base.model.vocab_size},
                         {"seq_len", base.train.seq_len}, {"batch_size", base.train.batch_size}}},
              {"ranks", o.ranks}, {"ranks_per_node", o.ranks_per_node},
              {"backend", name_of(base.runtime.backend)},
              {"mem_per_rank", o.mem_per_rank}, {"host_mem_per_node", o.host_mem_per_node},
              {"configured", configured ? layout_json(*configured) : json{{"error", configured_error}}},
              {"fits", json::array()}, {"rejected", json::array()},
              {"layouts_searched", fits.size() + rejected.size()}, {"layouts_invalid", invalid},
              {"refused", refused},
              {"seconds", seconds}};
    json per_rank = json::array();
    for (const PlannedRank& m : configured ? configured->ranks : std::vector<PlannedRank>{}) {
      json r = {{"rank", m.rank}, {"node", m.node}, {"dp", m.c.dp}, {"tp", m.c.tp}, {"pp", m.c.pp},
                {"peak_bytes", m.peak}, {"peak_phase", mem_phase_name(m.peak_phase)}};
      for (int c = 0; c < kNumMemCategories; ++c)
        r["predicted"][mem_category_name(static_cast<MemCategory>(c))] = m.table[static_cast<size_t>(c)];
      per_rank.push_back(r);
    }
    if (configured) j["configured"]["ranks"] = per_rank;
    for (size_t i = 0; i < fits.size() && i < static_cast<size_t>(o.top); ++i) j["fits"].push_back(layout_json(fits[i]));
    for (size_t i = 0; i < rejected.size() && i < static_cast<size_t>(o.top); ++i)
      j["rejected"].push_back(layout_json(rejected[i]));
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  auto gib = [](size_t b) { return fmt::format("{:.2f}", double(b) / double(1ull << 30)); };
  fmt::print("# meshlm plan: {} ranks, {} per node, backend {}; per rank {} {}, per node {} of host\n",
             o.ranks, o.ranks_per_node, name_of(base.runtime.backend),
             o.mem_per_rank ? format_bytes(double(o.mem_per_rank)) : std::string("no limit"),
             cuda ? "of device memory" : "of host memory", format_bytes(double(o.host_mem_per_node)));
  fmt::print("# model: L={} H={} C={} V={}, T={}, batch {} sequences per step\n", base.model.n_layer,
             base.model.n_head, base.model.n_embd, base.model.vocab_size, base.train.seq_len,
             base.train.batch_size);
  fmt::print("# runtime per rank {} ({} in the node's sum){}; rates: {:.0f} GFLOP/s per rank, {:.0f} / {:.0f} GB/s within / between nodes\n",
             format_bytes(double(o.runtime)), format_bytes(double(o.runtime_pss)),
             cuda ? ", device " + format_bytes(double(o.device_runtime)) : std::string(),
             o.rates.flops_per_s / 1e9, o.rates.intra_bytes_per_s / 1e9,
             o.rates.inter_bytes_per_s / 1e9);
  if (!data_note.empty()) fmt::print("# note: {}\n", data_note);
  if (!configured) {
    fmt::print("#\n# configured layout: not one of {} ranks: {}\n", o.ranks, configured_error);
  } else {
    fmt::print("#\n# configured layout: {} (stages {}): {}\n", describe(configured->cfg),
               stages_text(configured->stages),
               configured->overflow.empty() ? "fits" : "does not fit: " + configured->overflow);
  std::string head = fmt::format("# {:>5} {:>4} {:>11}", "rank", "node", "dp/tp/pp");
  for (int c = 0; c < kNumMemCategories; ++c)
    head += fmt::format(" {:>11}", mem_category_name(static_cast<MemCategory>(c)));
  head += fmt::format(" {:>11} {:>11} {:>15}", "runtime", "peak GiB", "peak phase");
  fmt::print("{}\n", head);
  for (const PlannedRank& m : configured->ranks) {
    std::string row = fmt::format("  {:>5} {:>4} {:>11}", m.rank, m.node,
                                  fmt::format("{}/{}/{}", m.c.dp, m.c.tp, m.c.pp));
    for (size_t c = 0; c < m.table.size(); ++c) row += fmt::format(" {:>11}", gib(m.table[c]));
    row += fmt::format(" {:>11} {:>11} {:>15}", gib(cuda ? o.device_runtime : o.runtime), gib(m.peak),
                       cuda ? "device" : mem_phase_name(m.peak_phase));
    fmt::print("{}\n", row);
  }
  if (configured->cfg.parallel.pp > 1) {
    std::string mem, time;
    for (size_t st = 0; st < configured->stage_peak.size(); ++st) {
      mem += (st ? " " : "") + gib(configured->stage_peak[st]);
      time += fmt::format("{}{:.4f}", st ? " " : "", configured->cost.stage_seconds[st]);
    }
    fmt::print("# stages: peak GiB {} (max/min {:.2f}); seconds per micro-batch {} (max/min {:.2f})\n",
               mem, spread(configured->stage_peak), time, spread(configured->cost.stage_seconds));
  }
  }
  auto table = [&](const std::vector<Layout>& v, bool fitting) {
    fmt::print("# {:>3} {:<34} {:>9} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n", "#",
               "layout", "stages", "peak GiB", "node GiB", "step s", "compute", "bubble", "tp",
               "pp", "dp");
    for (size_t i = 0; i < v.size() && i < static_cast<size_t>(o.top); ++i) {
      const Layout& L = v[i];
      fmt::print("  {:>3} {:<34} {:>9} {:>10} {:>10} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f}\n",
                 i + 1, describe(L.cfg), stages_text(L.stages), gib(L.worst), gib(L.node_worst),
                 L.cost.total(), L.cost.compute, L.cost.pipeline_bubble, L.cost.tp, L.cost.pp,
                 L.cost.dp);
      if (!fitting) fmt::print("        does not fit: {}\n", L.overflow);
    }
  };
  fmt::print("#\n# {} layouts fit (of {} the run accepts; {} more it would refuse), fastest first:\n",
             fits.size(), fits.size() + rejected.size(), invalid);
  for (const auto& [why, n] : refused) fmt::print("# refused ({} layouts): {}\n", n, why);
  table(fits, true);
  if (!rejected.empty()) {
    fmt::print("#\n# the fastest of the {} that do not fit:\n", rejected.size());
    table(rejected, false);
  }
  fmt::print("#\n# planned in {:.2f} s\n", seconds);
  return fits.empty() ? 1 : 0;
}

}  // namespace meshlm
