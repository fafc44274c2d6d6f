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
#include <functional>
#include <optional>
#include <sstream>
#include <string_view>

#include <boost/program_options.hpp>

#include "app/parameter_file.h"
#include "core/enum_names.h"
#include "core/error.h"
#include "mesh/mesh.h"
#include "ops/blas.h"
#include "plan/cost.h"
#include "plan/memory.h"
#include "plan/rank_plan.h"
#include "train/backend.h"
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
  std::string calibrate;
  std::vector<std::string> overrides;
};

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
  std::string mem_rank, mem_node, backend;
  po::options_description d("options");
  d.add_options()
      ("ranks", po::value<int>(&o.ranks)->default_value(0), "ranks of the job (N); required")
      ("ranks-per-node", po::value<int>(&o.ranks_per_node)->default_value(0), "ranks on each node (G); N need not be a multiple; required")
      ("mem-per-rank", po::value<std::string>(&mem_rank)->default_value(""),
       "memory one rank may use: host memory on the CPU backend, device memory on cuda "
       "(e.g. 80GiB; default: memory.limit_per_rank of FILE.cfg, else this machine's memory / G on cpu, none on cuda)")
      ("host-mem-per-node", po::value<std::string>(&mem_node)->default_value(""),
       "host memory of a node, shared by its G ranks (default: memory.limit_per_node of FILE.cfg, else this machine's memory)")
      ("backend", po::value<std::string>(&backend)->default_value(""), "cpu or cuda (default: runtime.backend of FILE.cfg)")
      ("top", po::value<int>(&o.top)->default_value(10), "layouts listed of each kind (fitting, rejected)")
      ("calibrate", po::value<std::string>(&o.calibrate)->default_value(""),
       "measure this machine and write its figures to this JSON file, for cluster.rates: the GEMM "
       "rate (one core, all cores, and at the sizes of small micro-batches), the memory bandwidth, "
       "a rank's runtime memory, and under mpiexec with 2 or more ranks the MPI latency and "
       "bandwidth between ranks 0 and 1 (within a node when they share one, else between nodes)")
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
  // A job of fewer ranks than a node holds puts them all on one node.
  o.ranks_per_node = std::min(o.ranks_per_node, o.ranks);
  if (!backend.empty()) {
    o.backend = enum_from_name<ComputeBackend>(backend);
    if (!o.backend)
      throw RankError("meshlm plan: --backend '" + backend + "': use " +
                          enum_choices<ComputeBackend>(" or "),
                      MESHLM_HERE);
    // The run planned is the file's on that backend, its keys checked for it
    // as `meshlm train --runtime.backend=B` checks them: the layouts listed
    // are those train accepts there. (A build without the backend, which
    // train would refuse, checks them for the file's and plans for B.)
    const std::string key = "--runtime.backend=";
    for (const std::string& a : o.overrides)
      if (a.rfind(key, 0) == 0 && a.substr(key.size()) != backend)
        throw RankError("meshlm plan: --backend " + backend + " and " + a + " disagree: give one",
                        MESHLM_HERE);
    if (backend_caps(*o.backend).built) o.overrides.push_back(key + backend);
  }
  if (!mem_rank.empty()) o.mem_per_rank = parse_memory_size("--mem-per-rank", mem_rank);
  if (!mem_node.empty()) o.host_mem_per_node = parse_memory_size("--host-mem-per-node", mem_node);
  return o;
}

std::string read_parameter_file(const std::string& path) {
  std::string text, why;
  if (!read_parameter_text(path, text, why))
    throw RankError("meshlm plan: cannot read parameter file '" + path + "'" + why, MESHLM_HERE);
  return text;
}

std::string stages_text(const std::vector<int>& v) {
  return fmt::format("{}", fmt::join(v, ","));
}

template <typename T>
double spread(const std::vector<T>& v) {
  return max_over_min(std::vector<double>(v.begin(), v.end()));
}

json layout_json(const PlannedLayout& L) {
  const ParallelConfig& p = L.cfg.parallel;
  json j = {{"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp}, {"zero_stage", p.zero_stage},
            {"micro_batch_size", L.cfg.train.micro_batch_size}, {"micro_batches", p.micro_batches},
            {"activation_checkpointing", name_of(p.activation_checkpointing)},
            {"schedule", name_of(p.schedule)}, {"stage_layers", L.stages},
            {"peak_bytes_max", L.worst}, {"peak_rank", L.worst_rank},
            {"node_bytes_max", L.node_worst},
            {"step_seconds", L.cost.total()},
            {"cost", {{"compute", L.cost.compute}, {"pipeline", L.cost.pipeline},
                      {"tp", L.cost.tp}, {"pp", L.cost.pp}, {"optimizer", L.cost.optimizer},
                      {"dp", L.cost.dp}, {"dp_hidden", L.cost.dp_hidden}}},
            {"stage_peak_bytes", L.stage_peak}, {"stage_seconds", L.cost.stage_seconds},
            {"stage_memory_max_over_min", spread(L.stage_peak)},
            {"stage_time_max_over_min", spread(L.cost.stage_seconds)},
            {"fits", L.overflow.empty()}};
  if (!L.overflow.empty()) j["overflow"] = L.overflow;
  if (!L.device_comm.empty()) j["device_comm"] = L.device_comm;
  return j;
}

}  // namespace

std::string plan_calibrate_target(const std::vector<std::string>& args) {
  if (args.empty() || std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end())
    return "";
  return parse_options(args).calibrate;
}

namespace {

// What meshlm plan found: the run's configuration as planned, the machine,
// every layout searched, and the configured one (or why there is none).
struct Plan {
  RunConfig base;  // its runtime.backend is the plan's (--backend, else the file's)
  PlanMachine m;
  std::string data_note;  // data.path's order left out of the memory
  bool auto_layout = false;
  LayoutSearch search;
  std::optional<PlannedLayout> configured;
  std::string configured_error;
  double seconds = 0;
};

// The plan of the parameter file on o.ranks ranks: the file as the run
// would take it (every key checked) and its layout, which may not be one the
// run accepts; every layout of o.ranks ranks the run would accept (under
// parallel.layout = auto, those its explicit [parallel] keys allow).
Plan make_plan(const Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string text = read_parameter_file(o.file);
  Plan plan;
  // The machine of a plan for the run `c` (its [cluster] and [memory], the
  // command line's limits first).
  auto machine_for = [&](const RunConfig& c) {
    PlanMachine pm = plan_machine(c.cluster, c.runtime.backend, o.ranks, o.ranks_per_node, c.comm.wait);
    apply_memory_limits(pm, c.memory, o.mem_per_rank, o.host_mem_per_node);
    pm.windows = data_windows(c.data, c.train.seq_len);
    plan.data_note = c.data.path.empty() || !std::filesystem::exists(c.data.path)
                         ? "data.path '" + c.data.path + "' is not there: its shuffled order (other) is not counted"
                         : "";
    return pm;
  };
  auto planned_for = [&](RunConfig c) {
    if (o.backend) c.runtime.backend = *o.backend;
    return c;
  };
  // Progress lines in the text output only: --json's stdout is the document.
  const std::function<void(size_t, size_t)> progress =
      o.json ? std::function<void(size_t, size_t)>() : search_progress(o.ranks);
  // parallel.layout = auto: the search meshlm train would make, with the
  // [parallel] keys the file gives kept.
  std::optional<LayoutSearch> auto_search;
  const LayoutChooser choose = [&](const RunConfig& one, const LayoutConstraints& k) {
    const RunConfig b = planned_for(one);
    auto_search = search_layouts(b, one.runtime.backend, machine_for(b), k, progress);
    if (auto_search->fits.empty())
      throw RankError("parallel.layout = auto: none of the layouts of " + std::to_string(o.ranks) +
                          " ranks fits",
                      MESHLM_HERE);
    RunConfig first = auto_search->fits[0].cfg;
    first.runtime.backend = one.runtime.backend;
    return first;
  };
  std::optional<RunConfig> as_configured;
  try {
    as_configured = parse_run_config(text, o.file, o.overrides, o.ranks, choose);
  } catch (const Error& e) {
    plan.configured_error = e.what();
  }
  plan.auto_layout = auto_search.has_value();
  // Else the file on one rank, its [parallel] layout set aside (the search
  // sets it): every other key still checked.
  std::vector<std::string> one_rank = o.overrides;
  for (const char* k : {"--parallel.layout=manual", "--parallel.dp=1", "--parallel.tp=1",
                        "--parallel.pp=1", "--parallel.micro_batches=0", "--parallel.stage_layers="})
    one_rank.push_back(k);
  const RunConfig file_base = as_configured && !plan.auto_layout
                                  ? *as_configured
                                  : parse_run_config(text, o.file, one_rank, 1);
  plan.base = planned_for(file_base);
  plan.m = machine_for(plan.base);
  plan.search = plan.auto_layout ? *auto_search
                                 : search_layouts(plan.base, file_base.runtime.backend, plan.m, {},
                                                  progress);
  if (plan.auto_layout) {
    if (!plan.search.fits.empty()) plan.configured = plan.search.fits[0];
  } else if (as_configured) {
    const ParallelConfig& p = as_configured->parallel;
    if (static_cast<long long>(p.dp) * p.tp * p.pp != o.ranks)
      plan.configured_error = fmt::format("parallel.dp {} x tp {} x pp {} is not {} ranks", p.dp,
                                          p.tp, p.pp, o.ranks);
    else
      plan.configured = evaluate_layout(planned_for(*as_configured), plan.m);
  }
  plan.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

// meshlm plan --json: the plan as one JSON document.
void print_plan_json(const Options& o, const Plan& plan) {
  const RunConfig& base = plan.base;
  const PlanMachine& m = plan.m;
  const std::vector<PlannedLayout>& fits = plan.search.fits;
  const std::vector<PlannedLayout>& rejected = plan.search.rejected;
  const std::optional<PlannedLayout>& configured = plan.configured;
  json j = {{"model", {{"n_layer", base.model.n_layer}, {"n_head", base.model.n_head},
                       {"n_embd", base.model.n_embd}, {"vocab_size", base.model.vocab_size},
                       {"seq_len", base.train.seq_len}, {"batch_size", base.train.batch_size}}},
            {"ranks", o.ranks}, {"ranks_per_node", o.ranks_per_node},
            {"backend", name_of(plan.base.runtime.backend)},
            {"mem_per_rank", m.mem_per_rank}, {"host_mem_per_node", m.host_mem_per_node},
            {"rates", {{"source", m.rates_source}, {"gflops_per_rank", m.rates.flops_per_s / 1e9},
                       {"intra_node_gbps", m.rates.intra_bytes_per_s / 1e9},
                       {"inter_node_gbps", m.rates.inter_bytes_per_s / 1e9},
                       {"intra_node_latency_us", m.rates.intra_latency_s * 1e6},
                       {"inter_node_latency_us", m.rates.inter_latency_s * 1e6},
                       {"runtime_per_rank", m.runtime}, {"runtime_pss_per_rank", m.runtime_pss},
                       {"device_runtime", m.device_runtime}}},
            {"configured_is_auto", plan.auto_layout},
            {"configured", configured ? layout_json(*configured) : json{{"error", plan.configured_error}}},
            {"fits", json::array()}, {"rejected", json::array()},
            {"layouts_searched", fits.size() + rejected.size()},
            {"layouts_invalid", plan.search.refused_count},
            {"refused", plan.search.refused},
            {"seconds", plan.seconds}};
  json per_rank = json::array();
  for (const PlannedRank& pr : configured ? configured->ranks : std::vector<PlannedRank>{}) {
    json r = {{"rank", pr.rank}, {"node", pr.node}, {"dp", pr.c.dp}, {"tp", pr.c.tp}, {"pp", pr.c.pp},
              {"peak_bytes", pr.peak}, {"peak_phase", mem_phase_name(pr.peak_phase)}};
    for (int c = 0; c < kNumMemCategories; ++c)
      r["predicted"][mem_category_name(static_cast<MemCategory>(c))] = pr.table[static_cast<size_t>(c)];
    per_rank.push_back(r);
  }
  if (configured) j["configured"]["ranks"] = per_rank;
  for (size_t i = 0; i < fits.size() && i < static_cast<size_t>(o.top); ++i) j["fits"].push_back(layout_json(fits[i]));
  for (size_t i = 0; i < rejected.size() && i < static_cast<size_t>(o.top); ++i)
    j["rejected"].push_back(layout_json(rejected[i]));
  std::cout << j.dump(2) << "\n";
}

std::string gib(size_t b) { return fmt::format("{:.2f}", double(b) / double(1ull << 30)); }

// The configured layout: whether it fits, each rank's predicted memory by
// category, and its stages' balance under pipeline parallelism.
void print_configured(const Options& o, const Plan& plan) {
  const std::optional<PlannedLayout>& configured = plan.configured;
  const bool device = backend_caps(plan.base.runtime.backend).device_memory;
  const PlanMachine& m = plan.m;
  if (!configured) {
    fmt::print("#\n# configured layout: not one of {} ranks: {}\n", o.ranks, plan.configured_error);
    return;
  }
  fmt::print("#\n# configured layout{}: {} (stages {}): {}\n",
             plan.auto_layout ? " (parallel.layout = auto: the first that fits)" : "",
             describe_layout(configured->cfg),
             stages_text(configured->stages),
             configured->overflow.empty() ? "fits" : "does not fit: " + configured->overflow);
  std::string head = fmt::format("# {:>5} {:>4} {:>11}", "rank", "node", "dp/tp/pp");
  for (int c = 0; c < kNumMemCategories; ++c)
    head += fmt::format(" {:>11}", mem_category_name(static_cast<MemCategory>(c)));
  head += fmt::format(" {:>11} {:>11} {:>15}", "runtime", "peak GiB", "peak phase");
  fmt::print("{}\n", head);
  for (const PlannedRank& pr : configured->ranks) {
    std::string row = fmt::format("  {:>5} {:>4} {:>11}", pr.rank, pr.node,
                                  fmt::format("{}/{}/{}", pr.c.dp, pr.c.tp, pr.c.pp));
    for (size_t c = 0; c < pr.table.size(); ++c) row += fmt::format(" {:>11}", gib(pr.table[c]));
    row += fmt::format(" {:>11} {:>11} {:>15}", gib(device ? m.device_runtime : m.runtime), gib(pr.peak),
                       device ? "device" : mem_phase_name(pr.peak_phase));
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

// The first o.top layouts of `v` with their memory and the cost model's
// seconds by term; for those that do not fit, why.
void print_layout_table(const Options& o, const std::vector<PlannedLayout>& v, bool fitting) {
  fmt::print("# {:>3} {:<34} {:>9} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
             "#", "layout", "stages", "peak GiB", "node GiB", "step s", "compute", "pipeline",
             "tp", "pp", "optimizer", "dp", "dp hidden");
  for (size_t i = 0; i < v.size() && i < static_cast<size_t>(o.top); ++i) {
    const PlannedLayout& L = v[i];
    fmt::print("  {:>3} {:<34} {:>9} {:>10} {:>10} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} "
               "{:>9.4f} {:>9.4f} {:>9.4f}\n",
               i + 1, describe_layout(L.cfg) + (L.device_comm == "host" ? " staged" : ""),
               stages_text(L.stages), gib(L.worst), gib(L.node_worst),
               L.cost.total(), L.cost.compute, L.cost.pipeline, L.cost.tp, L.cost.pp,
               L.cost.optimizer, L.cost.dp, L.cost.dp_hidden);
    if (!fitting) fmt::print("        does not fit: {}\n", L.overflow);
  }
}

// meshlm plan: the machine, the model, the configured layout, and the
// layouts that fit, fastest first, then the fastest of those that do not.
void print_plan_text(const Options& o, const Plan& plan) {
  const RunConfig& base = plan.base;
  const PlanMachine& m = plan.m;
  const bool device = backend_caps(plan.base.runtime.backend).device_memory;
  fmt::print("# meshlm plan: {} ranks, {} per node, backend {}; per rank {} {}, per node {} of host\n",
             o.ranks, o.ranks_per_node, name_of(plan.base.runtime.backend),
             m.mem_per_rank ? format_bytes(double(m.mem_per_rank)) : std::string("no limit"),
             device ? "of device memory" : "of host memory", format_bytes(double(m.host_mem_per_node)));
  fmt::print("# model: {}, T={}, batch {} sequences per step\n", base.model.describe(),
             base.train.seq_len, base.train.batch_size);
  fmt::print("# runtime per rank {} ({} in the node's sum){}; rates ({}): {:.0f} GFLOP/s per rank, "
             "{:.0f} / {:.0f} GB/s and {:.1f} / {:.1f} us within / between nodes\n",
             format_bytes(double(m.runtime)), format_bytes(double(m.runtime_pss)),
             device ? ", device " + format_bytes(double(m.device_runtime)) : std::string(),
             m.rates_source, m.rates.flops_per_s / 1e9, m.rates.intra_bytes_per_s / 1e9,
             m.rates.inter_bytes_per_s / 1e9, m.rates.intra_latency_s * 1e6,
             m.rates.inter_latency_s * 1e6);
  if (device)
    fmt::print("# {} GPUs per node; comm.device = {} (a layout marked 'staged' moves device buffers "
               "through the host: ranks of one of its groups share a GPU, or comm.device = host)\n",
               m.gpus_per_node, name_of(base.comm.device));
  if (!plan.data_note.empty()) fmt::print("# note: {}\n", plan.data_note);
  print_configured(o, plan);
  const std::vector<PlannedLayout>& fits = plan.search.fits;
  const std::vector<PlannedLayout>& rejected = plan.search.rejected;
  fmt::print("#\n# {} layouts fit (of {} the run accepts; {} more it would refuse), fastest first:\n",
             fits.size(), fits.size() + rejected.size(), plan.search.refused_count);
  for (const auto& [why, n] : plan.search.refused) fmt::print("# refused ({} layouts): {}\n", n, why);
  print_layout_table(o, fits, true);
  if (!rejected.empty()) {
    fmt::print("#\n# the fastest of the {} that do not fit:\n", rejected.size());
    print_layout_table(o, rejected, false);
  }
  fmt::print("#\n# planned in {:.2f} s\n", plan.seconds);
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  if (args.empty() || std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    parse_options(args, /*help_only=*/true);
    return 0;
  }
  const Options o = parse_options(args);
  const Plan plan = make_plan(o);
  if (o.json) {
    print_plan_json(o, plan);
    return 0;
  }
  print_plan_text(o, plan);
  return plan.search.fits.empty() ? 1 : 0;
}

}  // namespace meshlm
