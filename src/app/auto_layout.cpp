// parallel.layout = auto: the planner's choice for `meshlm train`
// (app/parameter_file.h: choose_auto_layout).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "app/parameter_file.h"
#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "core/error.h"
#include "core/log.h"
#include "mesh/mesh.h"

namespace meshlm {

namespace {

using nlohmann::json;

// Rank 0's search: the chosen layout as JSON, with the lines saying why.
json choose_on_rank_zero(const RunConfig& base, const LayoutConstraints& k, int world,
                         int ranks_per_node) {
  PlanMachine m = plan_machine(base.cluster, base.runtime.backend, world, ranks_per_node, base.comm.wait);
  const std::string limit_from = apply_memory_limits(m, base.memory);
  try {
    m.windows = data_windows(base.data, base.train.seq_len);
  } catch (const Error&) {
    // The run reports a bad token file itself.
  }
  const LayoutSearch s = search_layouts(base, base.runtime.backend, m, k, search_progress(world));
  const size_t searched = s.fits.size() + s.rejected.size();
  if (s.fits.empty()) {
    std::string msg = fmt::format(
        "parallel.layout = auto: none of the {} layouts of {} ranks that the run accepts fits "
        "{} per rank ({}) and {} per node",
        searched, world, m.mem_per_rank ? format_bytes(double(m.mem_per_rank)) : "no limit",
        limit_from, format_bytes(double(m.host_mem_per_node)));
    if (!s.rejected.empty())
      msg += fmt::format("; the fastest, {}, does not fit: {}", describe_layout(s.rejected[0].cfg),
                         s.rejected[0].overflow);
    if (searched == 0)
      for (const auto& [why, n] : s.refused) msg += fmt::format("; refused ({}): {}", n, why);
    throw RankError(msg + " (meshlm plan lists them)", MESHLM_HERE);
  }
  const PlannedLayout& L = s.fits[0];
  const StepCost& c = L.cost;
  std::string why = fmt::format(
      "# layout: parallel.layout = auto chose {} (stages {}) of {} layouts of {} ranks, {} per "
      "node, that fit ({} searched, {} refused by the run's rules)\n",
      describe_layout(L.cfg), fmt::join(L.stages, ","), s.fits.size(), world, ranks_per_node,
      searched, s.refused_count);
  why += fmt::format(
      "# layout: its estimated step {:.4g} s (compute {:.3g}, pipeline {:.3g}, tp {:.3g}, pp "
      "{:.3g}, optimizer {:.3g}, dp {:.3g}; rates: {}, {:.0f} GFLOP/s per rank); predicted peak {} on rank {} "
      "against {} per rank ({})\n",
      c.total(), c.compute, c.pipeline, c.tp, c.pp, c.optimizer, c.dp, m.rates_source,
      m.rates.flops_per_s / 1e9, format_bytes(double(L.worst)), L.worst_rank,
      m.mem_per_rank ? format_bytes(double(m.mem_per_rank)) : "no limit", limit_from);
  if (s.fits.size() > 1)
    why += fmt::format("# layout: the next fastest: {} at {:.4g} s\n", describe_layout(s.fits[1].cfg),
                       s.fits[1].cost.total());
  if (!s.rejected.empty() && s.rejected[0].cost.total() < c.total())
    why += fmt::format("# layout: faster but does not fit: {} at {:.4g} s: {}\n",
                       describe_layout(s.rejected[0].cfg), s.rejected[0].cost.total(),
                       s.rejected[0].overflow);
  const ParallelConfig& p = L.cfg.parallel;
  return json{{"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp}, {"zero_stage", p.zero_stage},
              {"micro_batches", p.micro_batches}, {"micro_batch_size", L.cfg.train.micro_batch_size},
              {"checkpointing", static_cast<int>(p.activation_checkpointing)},
              {"schedule", static_cast<int>(p.schedule)}, {"stage_layers", p.stage_layers.layers},
              {"why", why}};
}

}  // namespace

RunConfig choose_auto_layout(MPI_Comm job, const RunConfig& base, const LayoutConstraints& k) {
  std::unique_ptr<comm::Communicator> all = comm::make_mpi_communicator(job);
  // The largest node's ranks: each shares its node's cores and memory.
  int mine = node_rank_count(job, base.parallel.ranks_per_node), rpn = 0;
  all->all_reduce(&mine, &rpn, 1, DType::i32, comm::ReduceOp::max).wait();
  std::string text;
  bool ok = true;
  std::string err;
  if (all->rank() == 0) {
    try {
      text = choose_on_rank_zero(base, k, all->size(), rpn).dump();
    } catch (const std::exception& e) {
      ok = false;
      err = e.what();
    }
  }
  check_all(job, ok, err, MESHLM_HERE);
  const json j = json::parse(comm::broadcast_string(*all, std::move(text)));
  RunConfig c = base;
  c.parallel.dp = j.at("dp").get<int>();
  c.parallel.tp = j.at("tp").get<int>();
  c.parallel.pp = j.at("pp").get<int>();
  c.parallel.zero_stage = j.at("zero_stage").get<int>();
  c.parallel.micro_batches = j.at("micro_batches").get<int>();
  c.train.micro_batch_size = j.at("micro_batch_size").get<int>();
  c.parallel.activation_checkpointing = static_cast<Checkpointing>(j.at("checkpointing").get<int>());
  c.parallel.schedule = static_cast<PipelineSchedule>(j.at("schedule").get<int>());
  c.parallel.stage_layers.layers = j.at("stage_layers").get<std::vector<int>>();
  c.layout_choice = j.at("why").get<std::string>();
  std::string lines = c.layout_choice;
  if (!lines.empty() && lines.back() == '\n') lines.pop_back();
  log::info("{}", lines);
  return c;
}

}  // namespace meshlm
