#include "train/trainer.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>

#include "comm/device_comm.h"
#include "comm/errors.h"
#include "comm/mpi_comm.h"
#include "comm/stall_watchdog.h"
#include "core/error.h"
#include "core/heartbeat.h"
#include "core/files.h"
#include "core/progress.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/output_dir.h"
#include "io/run_log.h"
#include "io/tokens.h"
#include "model/gpt.h"
#include "ops/blas.h"
#include "plan/memory.h"
#include "quant/qlinear.h"
#include "load/base_loader.h"
#include "load/hf_dir.h"
#include "mesh/mesh.h"
#include "train/backend.h"
#include "train/checkpoint.h"
#include "train/device_access.h"
#include "train/group_comm.h"
#include "core/stop_signals.h"
#include "train/engine.h"
#include "train/report.h"
#include "train/threads.h"
#include "train/zero.h"
#include "train/lr_schedule.h"

#include <optional>
#include <utility>

namespace meshlm {

namespace {

// A run may replace the run log in output.dir when told to, or when it
// continues the run that wrote it (checkpoint.resume).
bool reuses_output_dir(const RunConfig& cfg) {
  return cfg.output.overwrite || cfg.checkpoint.resume != "none";
}

// Collective: the files a run names must be what their keys say, and no file
// may be both read and written: refused before anything is read or written,
// naming the keys.
void check_run_files(const RunConfig& cfg, MPI_Comm job, int rank) {
  try_all(job, "", [&] {
    if (rank != 0) return;
    const std::string run_log = (std::filesystem::path(cfg.output.dir) / "run.h5").string();
    // data.val_path is read only by an evaluation (train.eval_every).
    const std::string val_path = cfg.train.eval_every > 0 ? cfg.data.val_path : std::string();
    const std::pair<const char*, std::string> inputs[] = {
        {"data.path", cfg.data.path},   {"data.tokenize_from", cfg.data.tokenize_from},
        {"quant.base", cfg.quant.base}, {"the parameter file", cfg.source},
        {"data.val_path", val_path}};
    for (const auto& [key, path] : inputs) {
      if (path.empty()) continue;
      if (same_file(path, run_log))
        throw RankError(std::string(key) + " '" + path + "' is the run log '" + run_log +
                            "' (in output.dir) this run would write",
                        MESHLM_HERE);
      if (!cfg.quant.cache.empty() && same_file(path, cfg.quant.cache))
        throw RankError("quant.cache and " + std::string(key) + " are the same file, '" + path +
                            "': meshlm will not write over an input",
                        MESHLM_HERE);
    }
    if (!cfg.data.path.empty() && cfg.data.path.back() == '/')
      throw RankError("data.path '" + cfg.data.path + "' names a directory; it must name a token file",
                      MESHLM_HERE);
    if (same_file(cfg.data.path, cfg.data.tokenize_from))
      throw RankError("data.path and data.tokenize_from are the same file, '" + cfg.data.path +
                          "': the tokens would be written over the text",
                      MESHLM_HERE);
    io::check_output_dir(cfg.output.dir, reuses_output_dir(cfg));
    // The run log, and any step's checkpoint (checkpoint.every, a stop
    // signal, the end): a directory that cannot hold them is refused before
    // step 1. checkpoint.dir is output.dir/checkpoints unless it is given.
    auto check_writable = [](const char* key, const std::string& dir) {
      if (const std::string why = unwritable_dir_reason(dir); !why.empty())
        throw RankError(std::string(key) + ": '" + dir + "' " + why, MESHLM_HERE);
    };
    check_writable("output.dir", cfg.output.dir);
    check_checkpoint_dir(cfg);
    for (const auto& [key, path] : {std::pair<const char*, std::string>{"data.path", cfg.data.path},
                                    {"data.val_path", val_path},
                                    {"quant.base", cfg.quant.base}}) {
      if (path.empty() || (std::string(key) == "quant.base" && path == "init")) continue;
      // A Hugging Face model directory is a base too (load/hf_dir.h).
      if (std::string(key) == "quant.base" && load::is_directory(path)) continue;
      if (const std::string kind = non_regular_kind(path); !kind.empty())
        throw RankError(std::string(key) + ": '" + path + "' is " + kind, MESHLM_HERE);
    }
  }, MESHLM_HERE);
}

// "token file 'x.h5'", and the dataset when it is not the training tokens.
std::string token_file_text(const std::string& path, const std::string& dataset) {
  return "token file '" + path + "'" +
         (dataset == io::kTokensDataset ? std::string() : " (dataset '" + dataset + "')");
}

// Collective: opens `dataset` of the token file `path` (the value of `key`)
// on every rank. Every id is checked against the model's vocabulary before
// anything trains or is written: from a "max_id" attribute (meshlm tokenize
// writes one), else by reading the whole of it (each rank a slice).
io::TokenReader open_token_data(const std::string& key, const std::string& path,
                                const std::string& dataset, int vocab_size, MPI_Comm job) {
  namespace fs = std::filesystem;
  const std::string where = key + ": ", file = token_file_text(path, dataset);
  std::unique_ptr<io::TokenReader> reader;
  try_all(job, where, [&] {
    std::error_code ec;
    if (!fs::exists(path, ec))
      throw RankError("token file '" + path + "' does not exist", MESHLM_HERE);
    reader = std::make_unique<io::TokenReader>(io::TokenReader::open(path, dataset));
    const int64_t declared = reader->vocab_size_attr();
    if (declared > vocab_size)
      throw RankError(file + " declares vocab_size " + std::to_string(declared) +
                          " (attribute), larger than model.vocab_size = " + std::to_string(vocab_size),
                      MESHLM_HERE);
  }, MESHLM_HERE);

  std::unique_ptr<comm::Communicator> all = comm::make_mpi_communicator(job);
  // Every rank reads the same file (a node-local copy out of date would
  // split the data wrongly, and a max_id attribute on some ranks only would
  // send them into other collectives): its length and attributes agree.
  {
    const double mine[3] = {static_cast<double>(reader->size()),
                            static_cast<double>(reader->max_id_attr()),
                            static_cast<double>(reader->vocab_size_attr())};
    double low[3], high[3];
    all->all_reduce(mine, low, 3, DType::f64, comm::ReduceOp::min).wait();
    all->all_reduce(mine, high, 3, DType::f64, comm::ReduceOp::max).wait();
    const bool same = std::equal(low, low + 3, high);
    check_all(job, same,
              fmt::format("{}{} is not the same file on every rank: its tokens ({} to {}), max_id "
                          "({} to {}) or vocab_size ({} to {}) attributes (-1: none) differ between ranks",
                          where, file, low[0], high[0], low[1], high[1], low[2], high[2]),
              MESHLM_HERE);
  }
  const uint64_t n = reader->size(), p = all->size(), r = all->rank();
  const uint64_t begin = n * r / p, end = n * (r + 1) / p;  // this rank's slice
  double largest = static_cast<double>(reader->max_id_attr());
  if (largest < 0) {
    // Each rank reads its slice; rank 0 shows progress on large files.
    double mine = 0;
    try_all(job, where, [&] {
      constexpr uint64_t kPiece = 1 << 24;
      ProgressBar bar("checking token ids of " + path, (end - begin + kPiece - 1) / kPiece);
      for (uint64_t s = begin; s < end; s += kPiece) {
        mine = std::max(mine, static_cast<double>(reader->max_id(s, std::min(kPiece, end - s))));
        bar.update((s - begin) / kPiece + 1);
      }
    }, MESHLM_HERE);
    all->all_reduce(&mine, &largest, 1, DType::f64, comm::ReduceOp::max).wait();
  }
  if (largest >= vocab_size) {
    // Where: the first such token of the file (every rank ends with the same error).
    double mine = std::numeric_limits<double>::infinity(), first = 0;
    try_all(job, where, [&] {
      const uint64_t at = reader->first_at_least(begin, end - begin, static_cast<uint64_t>(vocab_size));
      if (at != UINT64_MAX) mine = static_cast<double>(at);
    }, MESHLM_HERE);
    all->all_reduce(&mine, &first, 1, DType::f64, comm::ReduceOp::min).wait();
    const uint64_t at = std::isfinite(first) ? static_cast<uint64_t>(first) : 0;
    int32_t id = 0;
    try_all(job, where, [&] { reader->read(at, 1, &id); }, MESHLM_HERE);
    throw CollectiveError(fmt::format("{}{}: position {} has id {}, >= vocab_size {} "
                                      "(model.vocab_size)",
                                      where, file, at, static_cast<uint32_t>(id), vocab_size),
                          MESHLM_HERE);
  }
  return std::move(*reader);
}

// Collective: makes sure data.path exists, tokenizing data.tokenize_from on
// rank 0 when it does not, and opens the token file on every rank, its ids
// checked (open_token_data).
io::TokenReader open_training_data(const DataConfig& d, int vocab_size, MPI_Comm job, int rank) {
  namespace fs = std::filesystem;
  try_all(job, "data.tokenize_from: ", [&] {
    std::error_code ec;
    if (rank != 0 || fs::exists(d.path, ec) || d.tokenize_from.empty()) return;
    log::info("# tokenizing {} -> {} (byte-level, vocabulary 256)", d.tokenize_from, d.path);
    const uint64_t n = io::tokenize_bytes(d.tokenize_from, d.path);
    log::info("# {} tokens written", n);
  }, MESHLM_HERE);
  return open_token_data("data.path", d.path, io::kTokensDataset, vocab_size, job);
}

// Where the held-out tokens of train.eval_every are: a file, its dataset and
// the key that names the file; no path when there is no evaluation.
struct HeldOut {
  std::string key, path, dataset;
};

// Collective (rank 0 decides, every rank learns): data.val_path's file (its
// "val_tokens" dataset when it has one, else its tokens), or data.path's
// "val_tokens" dataset when data.val_path is empty. Never the training
// tokens themselves: data.val_path naming data.path's file without a
// "val_tokens" dataset is refused, naming both keys.
HeldOut find_held_out(const RunConfig& cfg, MPI_Comm job, int rank) {
  const TrainConfig& tc = cfg.train;
  const DataConfig& d = cfg.data;
  if (tc.eval_every == 0) {
    if (!d.val_path.empty())
      log::warn("data.val_path = {} is not read: train.eval_every = 0 (no evaluation)", d.val_path);
    return {};
  }
  const std::string val = io::kValTokensDataset;
  int32_t choice = 0;  // 1: data.val_path's val_tokens, 2: its tokens, 3: data.path's val_tokens
  try_all(job, "", [&] {
    if (rank != 0) return;
    std::error_code ec;
    if (d.val_path.empty()) {
      if (!io::TokenReader::has_dataset(d.path, val))
        throw RankError(fmt::format("train.eval_every = {} needs held-out tokens: data.val_path "
                                    "is empty and data.path '{}' has no dataset '{}' (meshlm "
                                    "tokenize --val-fraction writes one); set data.val_path, or "
                                    "train.eval_every = 0",
                                    tc.eval_every, d.path, val),
                        MESHLM_HERE);
      choice = 3;
    } else if (!std::filesystem::exists(d.val_path, ec)) {
      throw RankError("data.val_path: token file '" + d.val_path + "' does not exist",
                      MESHLM_HERE);
    } else if (io::TokenReader::has_dataset(d.val_path, val)) {
      choice = 1;
    } else if (same_file(d.val_path, d.path)) {
      throw RankError(fmt::format("data.val_path and data.path are the same file, '{}', which "
                                  "has no dataset '{}': evaluating on the training tokens "
                                  "measures nothing held out; name a file of held-out tokens "
                                  "(or give data.path a dataset '{}': meshlm tokenize "
                                  "--val-fraction)",
                                  d.val_path, val, val),
                      MESHLM_HERE);
    } else {
      choice = 2;
    }
  }, MESHLM_HERE);
  std::unique_ptr<comm::Communicator> all = comm::make_mpi_communicator(job);
  all->broadcast(&choice, 1, DType::i32, 0).wait();
  if (choice == 3) return {"data.path", d.path, val};
  return {"data.val_path", d.val_path, choice == 1 ? val : std::string(io::kTokensDataset)};
}

// What a rank is predicted to need at its peak, and in words: the runtime's
// part and, per category, what is live in the phase of the peak.
struct RankDemand {
  size_t bytes = 0;
  std::string detail;
};
RankDemand rank_demand(const PhasedMemory& phased, const MemoryByCategory& predicted,
                       const ProcessPrediction& expected) {
  RankDemand d;
  // On the CPU the process prediction (runtime + largest phase); elsewhere
  // the categories' peaks, host and device together.
  MemoryByCategory live = predicted;
  std::string when;
  if (expected.peak() > 0) {
    d.bytes = expected.peak();
    if (const PhasedMemory::Moment* top = phased.peak_moment()) {
      live = top->live;
      when = std::string(" in ") + mem_phase_name(top->phase);
    }
    d.detail = "runtime " + format_bytes(static_cast<double>(expected.runtime));
  } else {
    d.bytes = total(predicted);
  }
  for (int c = 0; c < kNumMemCategories; ++c) {
    if (live[c] == 0) continue;
    if (!d.detail.empty()) d.detail += ", ";
    d.detail += std::string(mem_category_name(static_cast<MemCategory>(c))) + " " +
                format_bytes(static_cast<double>(live[c]));
  }
  d.detail = format_bytes(static_cast<double>(d.bytes)) + when + " (" + d.detail + ")";
  return d;
}

// Collective: before anything large is allocated, the run is refused when a
// rank's predicted peak exceeds memory.limit_per_rank, or the sum over the
// ranks of a node exceeds memory.limit_per_node or the machine's physical
// memory; under memory.force it starts with a warning instead.
void check_memory_limits(const RankDemand& mine, const ProcessPrediction& expected,
                         const ProcessMesh& mesh, const MemoryConfig& lim) {
  const MeshCoords c = mesh.coords();
  std::unique_ptr<comm::Communicator> world = comm::make_mpi_communicator(mesh.world());
  auto refuse = [&](bool over, const std::string& what) {
    const int32_t n_over = over ? 1 : 0;
    int32_t ranks_over = 0;
    world->all_reduce(&n_over, &ranks_over, 1, DType::i32, comm::ReduceOp::sum).wait();
    if (ranks_over == 0) return;
    const std::string count =
        ranks_over > 1 ? fmt::format(" ({} ranks in all are over)", ranks_over) : std::string();
    if (lim.force) {
      // Rank 0 prints the lowest such rank's message.
      if (const auto first = first_failure(mesh.world(), !over, what))
        log::warn("{}{}; starting anyway (memory.force = true)", first->text, count);
      return;
    }
    check_all(mesh.world(), !over,
              what + count +
                  ". Spread the model over more ranks (parallel.tp, parallel.pp, parallel.dp with "
                  "parallel.zero_stage), lower train.micro_batch_size, set "
                  "parallel.activation_checkpointing = full, or set memory.force = true to start "
                  "anyway",
              MESHLM_HERE);
  };
  const std::string me = fmt::format("rank {} (dp {} tp {} pp {}, node {})", mesh.rank(), c.dp,
                                     c.tp, c.pp, mesh.node_index());
  if (lim.rank_limit_bytes > 0)
    refuse(mine.bytes > lim.rank_limit_bytes,
           fmt::format("{} is predicted to need {}, more than memory.limit_per_rank = {} ({})", me,
                       mine.detail, lim.limit_per_rank,
                       format_bytes(static_cast<double>(lim.rank_limit_bytes))));
  // A group's sum, its size, and whether this rank is its first.
  struct GroupSum {
    double bytes;
    int size;
    bool first;
  };
  // On the CPU a group's memory is its summed PSS (predicted_node_peaks:
  // each phase summed over the ranks, the largest taken; shared pages once);
  // elsewhere the sum of the ranks' peaks.
  auto group_sum = [&](MPI_Comm group) {
    std::unique_ptr<comm::Communicator> g = comm::make_mpi_communicator(group);
    std::array<double, kNumMemPhases> mine_by_phase{}, sum{};
    for (int p = 0; p < kNumMemPhases; ++p)
      mine_by_phase[p] = expected.runtime_pss > 0
                             ? static_cast<double>(expected.runtime_pss + expected.phases[p])
                             : static_cast<double>(mine.bytes);
    g->all_reduce(mine_by_phase.data(), sum.data(), kNumMemPhases, DType::f64,
                  comm::ReduceOp::sum)
        .wait();
    return GroupSum{*std::max_element(sum.begin(), sum.end()), g->size(), g->rank() == 0};
  };
  if (lim.node_limit_bytes > 0) {
    const GroupSum node = group_sum(mesh.node());
    refuse(node.first && node.bytes > static_cast<double>(lim.node_limit_bytes),
           fmt::format("the {} rank(s) of node {} are predicted to need {} together, more than "
                       "memory.limit_per_node = {} ({})",
                       node.size, mesh.node_index(), format_bytes(node.bytes), lim.limit_per_node,
                       format_bytes(static_cast<double>(lim.node_limit_bytes))));
  }
  const double physical = static_cast<double>(physical_memory_bytes());
  const GroupSum host = group_sum(mesh.host());
  refuse(host.first && physical > 0 && host.bytes > physical,
         fmt::format("the {} rank(s) of this machine are predicted to need {} together, more than "
                     "its physical memory of {}",
                     host.size, format_bytes(host.bytes), format_bytes(physical)));
}

// ---- run_training's phases ------------------------------------------------------

// Every rank's choice of how to wait for messages: polling, or sleeping
// where the node's ranks share cores (comm.wait = auto); set for the process.
comm::WaitPolicy apply_wait_policy(comm::WaitPolicy asked, const RankThreads& threads) {
  const comm::WaitPolicy wait = asked != comm::WaitPolicy::automatic ? asked
                                : shares_cores(threads)              ? comm::WaitPolicy::sleep
                                                                     : comm::WaitPolicy::poll;
  comm::set_wait_policy(wait);
  return wait;
}

// Prepare the run (collective): the process mesh, the threads and the wait
// policy, the stall watchdog, the backend; the run's files checked, the
// token data opened and its loader made; the rank's plan and its predicted
// memory, checked against the limits before anything large is allocated.
// Made in this order and torn down in the reverse, after everything the run
// builds on it.
class RunContext {
public:
  RunContext(const RunConfig& cfg, MPI_Comm job);
  RunContext(const RunContext&) = delete;
  RunContext& operator=(const RunContext&) = delete;

  const ProcessMesh mesh;
  const std::unique_ptr<comm::Communicator> world;
  const RankThreads threads;
  std::unique_ptr<comm::StallWatchdog> watchdog;  // armed from the first step to the last checkpoint
  std::unique_ptr<Backend> backend;
  // How the rank's groups move device buffers: comm.device resolved per
  // group (train/group_paths.h), which the memory prediction and the engine
  // share.
  DeviceRoute route;
  std::optional<io::TokenReader> data;  // the loader reads it
  std::unique_ptr<io::BatchLoader> loader;
  // train.eval_every: the held-out tokens and their loader (in file order);
  // null when there is no evaluation.
  HeldOut held_out;
  std::optional<io::TokenReader> val_data;
  std::unique_ptr<io::BatchLoader> val_loader;
  RankPlan shape;
  PhasedMemory phased;
  MemoryByCategory predicted{};
  ProcessPrediction expected;

private:
  void open_held_out(const RunConfig& cfg);
  void predict_memory(const RunConfig& cfg);
};

RunContext::RunContext(const RunConfig& cfg, MPI_Comm job)
    : mesh(job, MeshLayout(cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp),
           cfg.parallel.ranks_per_node),
      world(comm::make_mpi_communicator(mesh.world())),
      threads(configure_threads(cfg.runtime.threads, mesh)) {
  const ParallelConfig& pc = cfg.parallel;
  const TrainConfig& tc = cfg.train;
  const comm::WaitPolicy wait = apply_wait_policy(cfg.comm.wait, threads);
  // Collective over the machine's ranks when on: their table.
  watchdog = std::make_unique<comm::StallWatchdog>(mesh.world(), mesh.host(),
                                                   cfg.runtime.stall_timeout_s);
  log::info("# meshlm {} | {} rank(s) = dp {} x tp {} x pp {} on {} node(s) | parameter file {}",
            MESHLM_VERSION, mesh.layout().world(), pc.dp, pc.tp, pc.pp, mesh.node_count(),
            cfg.source);
  backend = std::make_unique<Backend>(cfg.runtime.backend, mesh, tc.precision,
                                      cfg.runtime.op_timings, cfg.cluster.gpus_per_node);
  route = device_route(cfg, mesh, *backend);
  mesh.print_rank_lines(fmt::format("device {} | cores {} | threads {} | waits {}{}",
                                    backend->describe(), threads.cores.text(), threads.threads,
                                    name_of(wait),
                                    backend->caps().device_memory
                                        ? " | groups " + rank_group_paths(route.paths, mesh)
                                        : std::string()));

  const int rank = mesh.rank();
  check_run_files(cfg, mesh.world(), rank);
  data.emplace(open_training_data(cfg.data, cfg.model.vocab_size, mesh.world(), rank));
  const MeshCoords me = mesh.coords();
  try_all(mesh.world(), "data.path: ", [&] {
    loader = std::make_unique<io::BatchLoader>(*data, tc.micro_batch_size, tc.seq_len,
                                               cfg.data.shuffle, tc.seed, cfg.model.vocab_size,
                                               me.dp, pc.dp);
  }, MESHLM_HERE);
  log::info("# data: {} ({} tokens, {} sequences of {} per epoch)", cfg.data.path, data->size(),
            loader->windows_per_epoch(), tc.seq_len);
  open_held_out(cfg);

  shape = planned_rank_plan(cfg, mesh);
  if (!shape.model.lora.enabled && !cfg.quant.cache.empty())
    log::warn("quant.cache = {} is not used: finetune.mode = full quantizes nothing", cfg.quant.cache);
  predict_memory(cfg);
}

// train.eval_every (collective): the held-out tokens found, opened and
// checked like data.path, and their loader: file order, the batch split over
// DP as training's. Its window order needs no buffer and its batches go
// through the training loop's own, so evaluation adds nothing to the
// memory prediction.
void RunContext::open_held_out(const RunConfig& cfg) {
  const TrainConfig& tc = cfg.train;
  const int rank = mesh.rank();
  held_out = find_held_out(cfg, mesh.world(), rank);
  if (held_out.path.empty()) return;
  const HeldOut& h = held_out;
  val_data.emplace(open_token_data(h.key, h.path, h.dataset, cfg.model.vocab_size, mesh.world()));
  const std::string file = token_file_text(h.path, h.dataset);
  const uint64_t n = val_data->size(), T = static_cast<uint64_t>(tc.seq_len);
  check_all(mesh.world(), n >= T + 1,
            fmt::format("{}: {} has {} tokens; model.seq_len {} needs at least {} for one "
                        "held-out sequence",
                        h.key, file, n, T, T + 1),
            MESHLM_HERE);
  try_all(mesh.world(), h.key + ": ", [&] {
    val_loader = std::make_unique<io::BatchLoader>(*val_data, tc.micro_batch_size, tc.seq_len,
                                                   false, tc.seed, cfg.model.vocab_size,
                                                   mesh.coords().dp, cfg.parallel.dp);
  }, MESHLM_HERE);
  const uint64_t windows = val_loader->windows_per_epoch();
  const uint64_t wanted = static_cast<uint64_t>(tc.eval_batches) * tc.batch_size;
  log::info("# validation: {} ({} tokens, {} sequences of {}) | every {} steps and at the last: "
            "the first {} sequences = train.eval_batches {} x train.batch_size {}, forward only",
            file, n, windows, tc.seq_len, tc.eval_every, wanted, tc.eval_batches, tc.batch_size);
  if (windows < wanted)
    log::warn("{}: {} holds {} sequences of {}, fewer than the {} an evaluation reads "
              "(train.eval_batches {} x train.batch_size {}): they are read around again from "
              "the start, so some count more than once",
              h.key, file, windows, tc.seq_len, wanted, tc.eval_batches, tc.batch_size);
}

// The categories by phase, printed; on the CPU the runtime's part (what is
// resident now outside the tracked buffers: code, libraries, MPI, the heap,
// OpenBLAS's buffer once a GEMM of the largest panel has filled it); then
// the limits checked.
void RunContext::predict_memory(const RunConfig& cfg) {
  const RunMemoryOptions o =
      memory_options(cfg, loader->windows_per_epoch(), route.paths, threads.threads);
  phased = predict_run_phases(cfg.model, shape, o);
  predicted = predicted_categories(cfg.model, shape, o, phased);
  print_predicted_memory(predicted, *world);
  if (backend_caps(cfg.runtime.backend).openblas_warm_up) {
    {
      Buffer scratch(ops::kGemmWarmUpFloats * sizeof(float), MemCategory::workspace,
                     "OpenBLAS warm-up", Device::cpu);
      ops::warm_up_gemm(scratch.as<float>());
    }
    const ProcessMemory now = read_process_memory();
    const size_t tracked = MemTracker::get().current_total(Device::cpu);
    expected.runtime = now.rss > tracked ? now.rss - tracked : 0;
    expected.runtime_pss = now.pss > tracked ? now.pss - tracked : 0;
    for (int p = 0; p < kNumMemPhases; ++p)
      expected.phases[p] = phased.phase_total(static_cast<MemPhase>(p));
    expected.shared = shape.shared_read_bytes;
  }
  expected.node = mesh.node_index();
  check_memory_limits(rank_demand(phased, predicted, expected), expected, mesh, cfg.memory);
}

// Load the base (LoRA, collective): the frozen model quantized once per node
// into its shared window (quant.share), or null in full training.
std::unique_ptr<load::FrozenBase> load_frozen_base(const RunConfig& cfg, const RunContext& run,
                                                   SectionTimers& timers) {
  if (!run.shape.model.lora.enabled) return nullptr;
  ScopedTimer st(timers, Section::checkpoint);
  MemTracker::get().enter(MemPhase::base_loading);
  const std::string base_name =
      cfg.quant.base.empty() ? std::string(cfg.model.arch == ModelArch::llama ? "Llama" : "GPT-2") + " initialisation, train.seed"
                             : cfg.quant.base;
  const bool private_copies = cfg.quant.share == quant::ShareMode::per_rank;
  log::info("# base loading: {} into {}{} ({} of {})", base_name,
            private_copies ? "a private copy per rank" : "one node-shared window per node",
            !private_copies && cfg.quant.broadcast == quant::BaseBroadcast::nccl
                ? ", through the node leaders' GPUs (quant.broadcast = nccl)"
                : "",
            name_of(cfg.quant.type),
            format_bytes(static_cast<double>(load::make_manifest(cfg.model, cfg.quant.type).bytes)));
  // quant.broadcast = nccl: the leaders' GPUs carry the store, through a
  // chunk of each leader's device memory (docs/memory.md: base loading).
  const KernelsDeviceAccess device(run.backend->kernels());
  std::unique_ptr<comm::Communicator> over;
  Buffer chunk;
  const MPI_Comm leaders = run.mesh.node_leaders();
  if (cfg.quant.broadcast == quant::BaseBroadcast::nccl && !private_copies)
    try_all(run.mesh.world(), "quant.broadcast = nccl: ", [&] {
      if (leaders == MPI_COMM_NULL) return;
      const DeviceRoute& route = run.route;
      const std::string name = fmt::format("the node leaders' group of rank {}", run.mesh.rank());
      const comm::DeviceComm path = comm::group_device_comm(
          leaders, comm::DeviceComm::nccl, run.backend->caps().nccl, route.backend, route.slot,
          name);
      over = make_group_communicator(leaders, path, device, route, name);
      chunk = Buffer(run.shape.base_broadcast_bytes, MemCategory::quantized,
                     "quant.broadcast_chunk", run.backend->kernels().device());
    }, MESHLM_HERE);
  const load::DeviceBroadcast d{over.get(), &device, chunk.data(), chunk.bytes()};
  std::unique_ptr<load::FrozenBase> base = load::FrozenBase::load(
      cfg.model, cfg.quant, cfg.train.seed, run.mesh, over ? &d : nullptr);
  log::info("# base: {} | {} {} in {} ({} per {}) | cache {} | {:.2f} s", base_name,
            name_of(cfg.quant.type), format_bytes(static_cast<double>(base->manifest().bytes)),
            private_copies ? "private copies" : "node-shared windows",
            format_bytes(static_cast<double>(base->manifest().bytes)),
            private_copies ? "rank" : "node", base->report().cache, base->seconds());
  return base;
}

// The lines that say what is trained and how: the model, the precision, the
// parallel layout, the adapters, the batch.
void print_run_lines(const RunConfig& cfg, const RankPlan& shape, const Backend& backend) {
  const TrainConfig& tc = cfg.train;
  const ParallelConfig& pc = cfg.parallel;
  const size_t n_full = table_numel(model_param_table(cfg.model));
  log::info("# model: {} (padded {}) | {} parameters ({})", cfg.model.describe(),
            cfg.model.padded_vocab_size(), n_full,
            format_bytes(static_cast<double>(n_full) * sizeof(float)));
  if (tc.precision == ops::Precision::fp32)
    log::info("# precision: fp32{}", backend.caps().fp32_note);
  else
    log::info("# precision: {} GEMM inputs, fp32 accumulation{} | master weights, AdamW moments, "
              "activations and the other ops fp32{}",
              name_of(tc.precision),
              backend.caps().native_16bit_gemm ? "" : " (emulated on the CPU)",
              tc.precision == ops::Precision::fp16
                  ? fmt::format(" | dynamic loss scale from {:g}, doubling after {} steps "
                                "without overflow",
                                tc.loss_scale.initial, tc.loss_scale.window)
                  : std::string());
  std::string layers;
  for (int l : stage_layers(cfg.model, pc, tc.seq_len)) {
    if (!layers.empty()) layers += ',';
    layers += std::to_string(l);
  }
  log::info("# parallel: layers per stage {} | schedule {} | activation checkpointing {} | "
            "attention {} | ZeRO stage {} | pipeline bubble {:.1f}%",
            layers, name_of(pc.schedule), name_of(pc.activation_checkpointing),
            name_of(tc.attention), pc.zero_stage, 100.0 * bubble_fraction(pc.pp, pc.micro_batches));
  if (shape.model.lora.enabled) {
    const size_t n_lora = table_numel(trainable_table(cfg.model, {}, shape.model));
    log::info("# lora: rank {} alpha {} on {} | {} trainable parameters ({:.2f}% of the base, "
              "which is frozen: no gradients, no optimizer state)",
              cfg.finetune.lora_rank, cfg.finetune.lora_alpha, slots_text(cfg.finetune.lora_targets), n_lora,
              100.0 * static_cast<double>(n_lora) / static_cast<double>(n_full));
  }
  log::info("# batch: {} sequences x {} tokens = dp {} x {} micro-batch(es) of {} | {} steps",
            tc.batch_size, tc.seq_len, pc.dp, pc.micro_batches, tc.micro_batch_size, tc.steps);
}

// Resume (collective): where training starts (a checkpoint, given adapters,
// or step 0) into `state` and the loader's cursor; then the run log, made
// once the starting point is known to be good (rank 0; null elsewhere).
std::unique_ptr<io::RunLog> resume(const RunConfig& cfg, const RunContext& run,
                                   Checkpointer& checkpointer, TrainingState& state,
                                   TrainSummary& summary) {
  int64_t resumed_at = -1;  // the step of the checkpoint resumed from
  if (!cfg.checkpoint.adapters_from.empty()) checkpointer.load_adapters(cfg.checkpoint.adapters_from);
  if (const std::string from = checkpointer.resume_path(); !from.empty()) {
    state = checkpointer.load(from);
    resumed_at = state.step;
    run.loader->set_cursor(state.cursor);
    summary.skipped_steps = static_cast<int>(state.skipped_steps);
    summary.overflow_steps = static_cast<int>(state.overflow_steps);
    if (state.step >= cfg.train.steps)
      log::info("# checkpoint: step {} is at or past train.steps = {}: nothing left to train",
                state.step, cfg.train.steps);
  }
  std::unique_ptr<io::RunLog> runlog;
  try_all(run.mesh.world(), "output.dir: ", [&] {
    if (run.mesh.rank() != 0) return;
    runlog = std::make_unique<io::RunLog>(cfg.output.dir, cfg.resolved, reuses_output_dir(cfg),
                                          resumed_at);
    if (!cfg.layout_choice.empty()) runlog->write_layout_choice(cfg.layout_choice);
    if (runlog->carried_rows() > 0)
      log::info("# run log: {} rows of the earlier run (steps up to {}) carried over",
                runlog->carried_rows(), resumed_at);
  }, MESHLM_HERE);
  return runlog;
}

// Train (collective): the steps from `state.step` to train.steps, each
// followed by the checkpoints it calls for (checkpoint.every, every_minutes,
// a stop signal on any rank), then the final one.
class TrainingLoop {
public:
  TrainingLoop(const RunConfig& cfg, RunContext& run, Engine& engine, Checkpointer& checkpointer,
               io::RunLog* runlog, TrainingState& state, TrainSummary& summary,
               SectionTimers& timers, const debug::Faults& faults)
      : cfg_(cfg), tc_(cfg.train), run_(run), engine_(engine), checkpointer_(checkpointer),
        runlog_(runlog), state_(state), summary_(summary), timers_(timers), faults_(faults),
        sched_{tc_.lr, tc_.lr_min_ratio, tc_.warmup_steps, tc_.steps},
        bt_(static_cast<size_t>(tc_.micro_batch_size) * tc_.seq_len),
        inputs_(cfg.parallel.micro_batches * bt_), targets_(inputs_.size()) {}

  void run();

private:
  void print_header() const;
  void train_one_step(int step);
  // train.eval_every: the held-out loss after `done` steps, printed and logged.
  void evaluate(int done);
  // A step the engine skipped (nothing updated), counted and reported;
  // throws under train.on_nonfinite = stop or past train.max_skipped.
  void skipped(const StepResult& res, int step);
  std::string save(int64_t steps_done);

  const RunConfig& cfg_;
  const TrainConfig& tc_;
  RunContext& run_;
  Engine& engine_;
  Checkpointer& checkpointer_;
  io::RunLog* runlog_;
  TrainingState& state_;
  TrainSummary& summary_;
  SectionTimers& timers_;
  const debug::Faults& faults_;
  const LRSchedule sched_;
  const size_t bt_;
  std::vector<int32_t> inputs_, targets_;
  int skipped_in_a_row_ = 0;
  double last_save_ = 0;
  int64_t saved_step_ = -1;
};

// One optimizer step: its data, the step, its line and its record.
void TrainingLoop::train_one_step(int step) {
  const double t0 = now_seconds();
  {
    ScopedTimer st(timers_, Section::data);
    for (int micro = 0; micro < cfg_.parallel.micro_batches; ++micro)
      run_.loader->next(inputs_.data() + micro * bt_, targets_.data() + micro * bt_);
  }
  const double lr = sched_.at(step);
  const StepResult res =
      engine_.step(inputs_.data(), targets_.data(), static_cast<float>(lr), step + 1);
  const double dt = now_seconds() - t0;
  if (res.overflow || res.nonfinite) return skipped(res, step);
  skipped_in_a_row_ = 0;
  const int T = tc_.seq_len;
  StepRecord r{step + 1, res.loss, lr, res.grad_norm, dt, static_cast<double>(tc_.batch_size) * T / dt};
  ++summary_.trained_steps;
  if (faults_.keeps_records()) summary_.steps.push_back(r);
  if ((step + 1) % tc_.log_every == 0 || step + 1 == tc_.steps || step == 0) {
    log::info("  {:>6} {:>9.4f} {:>10.3e} {:>10.4f} {:>10.1f} {:>11.0f}", r.step, r.loss, r.lr,
              r.grad_norm, 1e3 * r.seconds, r.tokens_per_s);
    if (runlog_) runlog_->append(r.step, r.loss, r.lr, r.grad_norm, r.tokens_per_s);
  }
}

// Evaluation (collective): the mean loss over the first train.eval_batches
// global batches of the held-out tokens, in file order and so the same
// windows every time, each split over the ranks like a training batch and
// run forward only (Engine::eval_loss). The batches go through the step's
// own token buffers; nothing a step reads is changed.
void TrainingLoop::evaluate(int done) {
  const double t0 = now_seconds();
  io::BatchLoader& loader = *run_.val_loader;
  loader.set_cursor({});
  double sum = 0;
  for (int b = 0; b < tc_.eval_batches; ++b) {
    {
      ScopedTimer st(timers_, Section::data);
      for (int micro = 0; micro < cfg_.parallel.micro_batches; ++micro)
        loader.next(inputs_.data() + micro * bt_, targets_.data() + micro * bt_);
    }
    sum += engine_.eval_loss(inputs_.data(), targets_.data());
  }
  const double loss = sum / tc_.eval_batches;
  const int64_t tokens = int64_t{tc_.eval_batches} * tc_.batch_size * tc_.seq_len;
  log::info("  step {} val_loss {:.4f} ({} batches, {} tokens, {:.2f} s)", done, loss,
            tc_.eval_batches, tokens, now_seconds() - t0);
  if (runlog_) runlog_->append_val(done, loss);
  if (faults_.keeps_records()) summary_.evals.push_back({done, loss});
}

void TrainingLoop::skipped(const StepResult& res, int step) {
  if (res.overflow && !res.nonfinite) {
    // fp16: nothing was updated; the scale has halved (train/loss_scaler.h).
    ++summary_.overflow_steps;
    log::warn("step {}: fp16 gradients overflowed at loss scale {:g} (loss {:.6g}, scaled "
              "gradient norm {:.6g}): step skipped, nothing updated; loss scale now {:g} ({} "
              "overflowing step(s) in all)",
              step + 1, res.loss_scale, res.loss, res.grad_norm * res.loss_scale,
              engine_.loss_scaler().scale(), summary_.overflow_steps);
    return;
  }
  // Nothing was updated from this step (the engine checks before AdamW).
  ++summary_.skipped_steps;
  ++skipped_in_a_row_;
  const std::string what = fmt::format(
      "step {}: the loss is {:.6g} and the gradient norm is {:.6g}{}{}", step + 1, res.loss,
      res.grad_norm,
      res.overflow ? fmt::format(" at every fp16 loss scale down to {:g}", res.loss_scale)
                   : std::string(),
      res.nonfinite_tensor.empty()
          ? std::string("; every gradient is finite")
          : "; the first tensor whose gradient is not finite is " + res.nonfinite_tensor);
  if (tc_.on_nonfinite == NonFinite::stop)
    throw CollectiveError(what + " (train.on_nonfinite = stop)", MESHLM_HERE);
  log::warn("{}: step skipped, nothing updated ({} in a row, {} in all)", what,
            skipped_in_a_row_, summary_.skipped_steps);
  if (skipped_in_a_row_ >= tc_.max_skipped)
    throw CollectiveError(fmt::format("{} steps in a row skipped (train.max_skipped = {}); the "
                                      "last: {}",
                                      skipped_in_a_row_, tc_.max_skipped, what),
                          MESHLM_HERE);
}

std::string TrainingLoop::save(int64_t steps_done) {
  state_.step = steps_done;
  state_.tokens_seen = steps_done * static_cast<int64_t>(tc_.batch_size) * tc_.seq_len;
  state_.cursor = run_.loader->cursor();
  state_.skipped_steps = summary_.skipped_steps;
  state_.overflow_steps = summary_.overflow_steps;
  const std::string path = checkpointer_.save(state_);
  saved_step_ = steps_done;
  last_save_ = now_seconds();
  return path;
}

void TrainingLoop::print_header() const {
  const CheckpointConfig& kc = cfg_.checkpoint;
  log::info("# checkpoint: {} | every {} | keep last {} | final {}{} | SIGTERM or SIGUSR1: "
            "checkpoint and stop",
            kc.resolved_dir,
            kc.every > 0 ? fmt::format("{} steps", kc.every)
                         : kc.every_minutes > 0 ? std::string("-") : std::string("- (none)"),
            kc.keep_last > 0 ? std::to_string(kc.keep_last) : std::string("all"),
            kc.final ? "yes" : "no", kc.async ? " | async" : "");
  if (kc.every_minutes > 0) log::info("# checkpoint: also every {:g} minutes", kc.every_minutes);
  log::info("# {:>6} {:>9} {:>10} {:>10} {:>10} {:>11}", "step", "loss", "lr", "grad_norm",
            "ms/step", "tokens/s");
  if (run_.watchdog->on())
    log::info("# stall watchdog: no progress for {:g} s ends the job (runtime.stall_timeout_s)",
              cfg_.runtime.stall_timeout_s);
}

void TrainingLoop::run() {
  // After a step: a stop signal on any rank (StopSignals, installed by the
  // caller), or checkpoint.every_minutes passed on rank 0's clock, makes
  // every rank write a checkpoint.
  last_save_ = now_seconds();
  const CheckpointConfig& kc = cfg_.checkpoint;
  print_header();
  MemTracker::get().enter(MemPhase::training);
  // bf16 / fp16 on the CPU's ops: the GEMMs' rounded tiles (ops/precision.h).
  std::optional<ops::RoundingScratch> rounding;
  if (const int n = rounding_threads(run_.backend->caps(), tc_.precision, run_.threads.threads))
    rounding.emplace(n);
  run_.watchdog->arm();
  for (int step = static_cast<int>(state_.step); step < tc_.steps; ++step) {
    train_one_step(step);
    if (tc_.eval_every > 0 && ((step + 1) % tc_.eval_every == 0 || step + 1 == tc_.steps))
      evaluate(step + 1);
    heartbeat::beat();
    // What every rank must agree on after the step: [stop signal, minutes due].
    std::array<int32_t, 2> mine{StopSignals::received(), 0}, any{};
    if (kc.every_minutes > 0 && run_.mesh.rank() == 0 &&
        now_seconds() - last_save_ >= 60.0 * kc.every_minutes)
      mine[1] = 1;
    run_.world->all_reduce(mine.data(), any.data(), 2, DType::i32, comm::ReduceOp::max).wait();
    const int done = step + 1;
    if (any[0] != 0) {
      const std::string path = save(done);
      checkpointer_.finish();  // on disk before the job ends (checkpoint.async)
      log::info("# {} received: stopped after step {} of {}; checkpoint {} written. Resume with "
                "checkpoint.resume = auto (or = {})",
                StopSignals::name(any[0]), done, tc_.steps, path, path);
      summary_.stopped_by_signal = any[0];
      break;
    }
    if ((kc.every > 0 && done % kc.every == 0) || any[1] != 0) save(done);
  }
  if (kc.final && summary_.stopped_by_signal == 0 && saved_step_ != tc_.steps &&
      state_.step < tc_.steps)
    save(tc_.steps);
  {
    ScopedTimer st(timers_, Section::checkpoint);
    checkpointer_.finish();  // a background write still going on (checkpoint.async)
  }
  run_.watchdog->disarm();
}

// The run log's memory tables: predicted, current and peak categories, the
// process prediction against what /proc saw, per rank and per node.
void write_run_log_memory(io::RunLog& runlog, const std::vector<RankMemory>& mem) {
  std::vector<MemoryByCategory> pred, cur, peak;
  std::vector<ProcessMemory> proc;
  std::vector<size_t> runtime, runtime_pss, peak_pred;
  std::vector<int> node;
  std::vector<double> error;
  std::vector<std::array<size_t, kNumMemPhases>> phase_pred, phase_peak;
  for (const RankMemory& r : mem) {
    pred.push_back(r.predicted);
    cur.push_back(r.current);
    peak.push_back(r.peak);
    proc.push_back(r.process);
    runtime.push_back(r.expected.runtime);
    runtime_pss.push_back(r.expected.runtime_pss);
    node.push_back(r.expected.node);
    peak_pred.push_back(r.expected.peak());
    error.push_back(r.error());
    phase_pred.push_back(r.expected.phases);
    phase_peak.push_back(r.phase_peak);
  }
  runlog.write_memory(pred, cur, peak, proc);
  runlog.write_process_prediction(runtime, peak_pred, error, phase_pred, phase_peak);
  std::vector<size_t> node_peaks, node_pss;
  for (const NodeMemory& n : node_memory(mem)) {
    node_peaks.push_back(n.predicted);
    node_pss.push_back(n.pss);
  }
  runlog.write_node_prediction(runtime_pss, node, node_peaks, node_pss);
}

// A GPU's memory (one rank): the tracked Buffers by category, and what the
// driver reports in use on the device.
void print_device_memory(const Backend& backend) {
  const MemTracker& t = MemTracker::get();
  std::string cats;
  for (int c = 0; c < kNumMemCategories; ++c) {
    const size_t peak = t.peak(static_cast<MemCategory>(c), Device::cuda);
    if (peak > 0)
      cats += fmt::format(" | {} {}", mem_category_name(static_cast<MemCategory>(c)),
                          format_bytes(static_cast<double>(peak)));
  }
  log::info("# device memory, {}: tracked peak {}{} | in use on the device now {} of {} ({})",
            backend.describe(), format_bytes(static_cast<double>(t.peak_total(Device::cuda))),
            cats, format_bytes(static_cast<double>(backend.device_used_bytes())),
            format_bytes(static_cast<double>(backend.device_total_bytes())),
            backend.caps().device_used_source);
}

// Report (collective): the loss scale, the memory table (predicted against
// measured, per rank), the device's memory, the timing tables; the run log's
// tables and its close.
void report_run(const RunConfig& cfg, RunContext& run, Engine& engine, SectionTimers& timers,
                io::RunLog* runlog, TrainSummary& summary, const debug::Faults& faults) {
  if (engine.loss_scaler().enabled()) {
    summary.loss_scale = engine.loss_scaler().scale();
    log::info("# fp16 loss scaling: {} overflowing step(s) skipped | loss scale at the end {:g}",
              summary.overflow_steps, summary.loss_scale);
  }
  timers.account_rest_as_other(summary.seconds);
  const std::vector<RankMemory> mem = gather_memory(run.predicted, run.expected, *run.world);
  comm::release_ring_scratch();  // a run leaves nothing behind for the next
  std::vector<std::string> labels;
  for (int r = 0; r < static_cast<int>(mem.size()); ++r) {
    const MeshCoords c = run.mesh.layout().coords(r);
    labels.push_back(fmt::format("dp {} tp {} pp {}", c.dp, c.tp, c.pp));
  }
  print_memory_table(mem, labels);
  if (run.backend->caps().device_memory) print_device_memory(*run.backend);
  print_timing_table(timers, summary.seconds, *run.world);
  if (run.backend->op_timer() != nullptr) {
    const int ran = summary.trained_steps + summary.skipped_steps + summary.overflow_steps;
    print_op_timing_table(*run.backend->op_timer(), ran, *run.world);
  }
  if (faults.keeps_records()) summary.final_params = engine.gather_params();
  if (runlog) {
    write_run_log_memory(*runlog, mem);
    runlog->write_timing(timers);
    runlog->close();
    log::info("# run log: {}/run.h5", cfg.output.dir);
  }
}

}  // namespace

TrainSummary run_training(const RunConfig& cfg, MPI_Comm job, debug::Records records) {
  const double t_start = now_seconds();
  SectionTimers timers;
  MemTracker& tracker = MemTracker::get();
  tracker.reset_peaks();
  tracker.enter(MemPhase::startup);
  comm::set_bucket_bytes(static_cast<size_t>(cfg.comm.bucket_mb) << 20);

  RunContext run(cfg, job);
  const std::unique_ptr<load::FrozenBase> base = load_frozen_base(cfg, run, timers);

  // What a test injects or keeps ([debug], `records`), behind one seam.
  const debug::Faults faults(cfg.debug, run.mesh.rank(), records);
  tracker.enter(MemPhase::initialisation);
  Engine engine(cfg, run.mesh, timers, base.get(), run.backend->kernels(),
                run.backend->dequantizer(), faults, run.route);
  print_run_lines(cfg, run.shape, *run.backend);

  Checkpointer checkpointer(cfg, run.mesh, engine, run.loader->windows_per_epoch(), timers,
                            faults);
  TrainingState state;
  TrainSummary summary;
  const std::unique_ptr<io::RunLog> runlog = resume(cfg, run, checkpointer, state, summary);

  // SIGTERM and SIGUSR1 from here to the end: a checkpoint, then a clean stop.
  const StopSignals stop_signals;
  TrainingLoop(cfg, run, engine, checkpointer, runlog.get(), state, summary, timers, faults).run();

  summary.seconds = now_seconds() - t_start;
  report_run(cfg, run, engine, timers, runlog.get(), summary, faults);
  return summary;
}

}  // namespace meshlm
