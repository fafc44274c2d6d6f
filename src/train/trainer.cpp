#include "train/trainer.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>

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
#include "ops/gpu_workspace.h"
#include "plan/memory.h"
#include "quant/qlinear.h"
#include "load/base_loader.h"
#include "mesh/mesh.h"
#include "train/backend.h"
#include "train/checkpoint.h"
#include "core/stop_signals.h"
#include "train/engine.h"
#include "train/report.h"
#include "train/threads.h"
#include "train/zero.h"
#include "train/lr_schedule.h"

#include <utility>

namespace meshlm {

size_t gpu_gemm_copies_bytes(const GPTConfig& m, const RankPlan& shape, ops::Precision p, int B,
                             int T) {
  if (p == ops::Precision::fp32) return 0;
  const int N = B * T, C = m.n_embd, NH = m.n_head, HS = C / NH;
  const int Vp = m.padded_vocab_size();
  const GPTOptions& o = shape.model;
  size_t most = 0;
  auto gemm = [&](bool ta, bool tb, int M, int Nn, int K, int lda, int ldb, long long sa = 0,
                  long long sb = 0, int batch = 1) {
    const auto [a, b] = ops::gemm_input_spans(ta, tb, M, Nn, K, lda, ldb, sa, sb, batch);
    most = std::max(most, ops::gemm_16bit_copies_bytes(a, b));
  };
  // A linear layer of n rows, (IC -> OC), trained (ops::matmul_*) or frozen
  // and quantized (quant::qlinear_*: tiles of qtile_rows rows), and
  // its LoRA adapters of rank r (model/lora.cpp) when it has them.
  auto linear = [&](int n, int IC, int OC, bool adapters) {
    if (!o.lora.enabled) {
      gemm(false, true, n, OC, IC, IC, IC);  // out = inp w^T
      // dinp += dout w and dw += dout^T inp on one copy of dout
      most = std::max(most, ops::gemm_16bit_copies_bytes(size_t(n) * OC, size_t(OC) * IC,
                                                         size_t(n) * IC));
      return;
    }
    const int tr = std::min(qtile_rows(o), OC);
    gemm(false, true, n, tr, IC, IC, IC);   // out[:, tile] = inp tile^T
    gemm(false, false, n, IC, tr, OC, IC);  // dinp += dout[:, tile] tile
    if (!adapters) return;
    const int r = o.lora.rank;
    gemm(false, true, n, r, IC, IC, IC);    // u = inp A^T
    gemm(false, true, n, OC, r, r, r);      // out += s u B^T
    gemm(true, false, OC, r, n, OC, r);     // dB += s dout^T u
    gemm(false, false, n, r, OC, OC, r);    // du = s dout B
    gemm(true, false, r, IC, n, r, IC);     // dA += du^T inp
    gemm(false, false, n, IC, r, r, IC);    // dinp += du A
  };
  const bool lora = o.lora.enabled;
  linear(N, C, 3 * C, lora && o.lora.targets.has(LinearSlot::qkv));
  linear(N, C, C, lora && o.lora.targets.has(LinearSlot::attn_out));
  linear(N, C, 4 * C, lora && o.lora.targets.has(LinearSlot::mlp_up));
  linear(N, 4 * C, C, lora && o.lora.targets.has(LinearSlot::mlp_down));
  // The classifier, a chunk of rows at a time (tied to wte, no adapter).
  linear(classifier_rows(m, shape.shard, o, size_t(N)), C, Vp, false);
  // Flash attention (cuda/flash_attention.cu) rounds qkv(N, 3C) into the
  // same buffer, and dout(N, C) beside it in the backward.
  if (o.attention == Attention::flash)
    most = std::max(most, ops::gemm_16bit_copies_bytes(size_t(N) * 3 * C, size_t(N) * C));
  // Attention keeping the probabilities (cuda/attention.cu), one sequence
  // at a time, strided-batched over the heads.
  if (o.attention == Attention::probabilities) {
    const long long TT = static_cast<long long>(T) * T;
    gemm(false, true, T, T, HS, 3 * C, 3 * C, HS, HS, NH);   // S = Q K^T
    gemm(false, false, T, HS, T, T, 3 * C, TT, HS, NH);      // Y = P V
    gemm(false, true, T, T, HS, C, 3 * C, HS, HS, NH);       // dP = dY V^T
    gemm(true, false, T, HS, T, T, C, TT, HS, NH);           // dV += P^T dY
    gemm(false, false, T, HS, T, T, 3 * C, TT, HS, NH);      // dQ += dS K
    gemm(true, false, T, HS, T, T, 3 * C, TT, HS, NH);       // dK += dS^T Q
  }
  return most;
}

size_t gpu_reduction_scratch_bytes(const GPTConfig& m, const RankPlan& shape, int B, int T) {
  if (shape.model.lora.enabled) return 0;  // no bias, LayerNorm or embedding gradient
  const long long N = static_cast<long long>(B) * T;
  const size_t C = static_cast<size_t>(m.n_embd);
  // Columns per call: LayerNorm's dw and db (2C together), the biases of
  // c_attn (3C / tp), c_proj (C), c_fc (4C / tp) and the MLP's c_proj (C).
  const size_t tp = static_cast<size_t>(shape.shard.tp_size);
  size_t bytes = ops::column_partials_bytes(N, std::max(2 * C, 4 * C / tp));
  if (shape.shard.first_stage) bytes += ops::embedding_index_bytes(N);
  return bytes;
}

size_t gpu_norm_scratch_bytes(const std::vector<ParamSpec>& trained) {
  // Kernels::sums_of_squares on a GPU: one double per tensor and one per
  // block of kSumOfSquaresBlock elements of it.
  size_t doubles = 0;
  for (const ParamSpec& p : trained)
    doubles += 1 + (p.numel() + ops::kSumOfSquaresBlock - 1) / ops::kSumOfSquaresBlock;
  return doubles * sizeof(double);
}

size_t ring_scratch_prediction(const RunConfig& cfg, const RankPlan& shape) {
  using comm::Reduction;
  const std::vector<ParamSpec> table = trainable_table(cfg.model, shape.shard, shape.model);
  // Gradients over dp, as ZeRO reduces them.
  size_t most = Zero::ring_scratch_bytes(shape.zero_stage, table, zero_layout(cfg.model, shape),
                                         cfg.parallel.dp, shape.dp_rank,
                                         zero2_wte_rows(cfg.model, shape, table));
  // Over tp: the activations in and out of each tensor-parallel region, the
  // LoRA adapters' partial gradients, the classifier's row statistics.
  const int tp = shape.shard.tp_size;
  const size_t N = static_cast<size_t>(cfg.train.micro_batch_size) * cfg.train.seq_len;
  size_t tp_count = std::max(N * cfg.model.n_embd, 2 * N);
  // (Of the parameters only a LoRA factor that every TP rank holds whole
  // gets a partial gradient summed over tp: model/gpt_linear.cpp.)
  for (const ParamSpec& p : table)
    if ((p.role == ParamRole::lora_a || p.role == ParamRole::lora_b) && p.tp_dim < 0)
      tp_count = std::max(tp_count, p.numel());
  most = std::max(most, comm::ring_scratch_bytes_of(Reduction::all_reduce, tp_count, DType::f32, tp));
  // Over pp: the tied embedding's gradient, from the last stage to the first
  // (the root; the last stage starts the chain and needs no scratch).
  // (ZeRO 2 sends it in pieces through its bucket instead).
  if (cfg.parallel.pp > 1 && shape.shard.first_stage && shape.zero_stage < 2)
    for (const ParamSpec& p : table)
      if (p.tied != TiedGroup::none)
        most = std::max(most,
                        comm::ring_scratch_bytes_of(Reduction::reduce, p.numel(), DType::f32, 2));
  return most;
}

PhasedMemory predict_run_phases(const RunConfig& cfg, const RankPlan& shape, uint64_t windows) {
  PhasedMemory phased = predict_phases(cfg.model, shape, windows, cfg.data.shuffle);
  phased.add(MemPhase::training, MemCategory::comm, ring_scratch_prediction(cfg, shape));
  // checkpoint.async: the host snapshot, made with the checkpointer after
  // the training buffers (the last moment of initialisation) and kept.
  if (cfg.checkpoint.async) {
    const size_t snapshot = checkpoint_snapshot_numel(cfg.model, shape) * sizeof(float);
    PhasedMemory::Moment* made = nullptr;
    for (PhasedMemory::Moment& m : phased.moments)
      if (m.phase == MemPhase::initialisation) made = &m;
    if (made) at(made->live, MemCategory::checkpoint) += snapshot;
    phased.add(MemPhase::training, MemCategory::checkpoint, snapshot);
  }
  // On the CPU the start-up's GEMM that makes OpenBLAS's buffer resident.
  if (cfg.runtime.backend == ComputeBackend::cpu)
    phased.add(MemPhase::startup, MemCategory::workspace, ops::kGemmWarmUpFloats * sizeof(float));
  return phased;
}

MemoryByCategory predicted_categories(const RunConfig& cfg, const RankPlan& shape,
                                      const PhasedMemory& phased) {
  MemoryByCategory predicted = phased.category_peaks();
  if (cfg.runtime.backend != ComputeBackend::cuda) return predicted;
  const TrainConfig& tc = cfg.train;
  // On a GPU each trained tensor is made on the host a block of rows at a
  // time and uploaded (GPT::set_weights): host workspace of one block.
  const std::vector<ParamSpec> trained = trainable_table(cfg.model, shape.shard, shape.model);
  const size_t block = GPT::weight_block_bytes(trained, shape.shard.tp_size, /*host=*/false);
  // The table adds each category's host and device peaks: the staging
  // (host) and the GEMMs' 16-bit copies (device) count both.
  at(predicted, MemCategory::workspace) =
      std::max(at(predicted, MemCategory::workspace), block) +
      gpu_gemm_copies_bytes(cfg.model, shape, tc.precision, tc.micro_batch_size, tc.seq_len) +
      gpu_reduction_scratch_bytes(cfg.model, shape, tc.micro_batch_size, tc.seq_len) +
      gpu_norm_scratch_bytes(trained) + ops::kUploadStagingBytes;
  if (shape.model.lora.enabled)
    at(predicted, MemCategory::quantized) +=
        GPT::quantized_matrix_bytes(cfg.model, shape.shard, cfg.quant.type);
  return predicted;
}

RankPlan planned_rank_plan(const RunConfig& cfg, const ProcessMesh& mesh) {
  return rank_plan_at(cfg, mesh.coords(), mesh.rank(), mesh.node_rank());
}

RankPlan rank_plan_at(const RunConfig& cfg, const MeshCoords& c, int world_rank, int node_rank) {
  RankPlan shape = Engine::plan_of(cfg, c);
  if (shape.model.lora.enabled) {
    const load::StoreManifest manifest = load::make_manifest(cfg.model, cfg.quant.type);
    const bool per_rank = cfg.quant.share == quant::ShareMode::per_rank;
    const bool holder = per_rank || node_rank == 0;
    const bool quantizes = per_rank || world_rank == 0;
    shape.quantized_bytes = holder ? manifest.bytes : 0;
    shape.base_staging_bytes = quantizes ? manifest.staging_bytes() : 0;
    if (!holder)
      shape.shared_read_bytes = load::store_pages_read(manifest, cfg.model, shape.shard,
                                                       cfg.train.seq_len, page_bytes());
  }
  return shape;
}

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
    const std::pair<const char*, std::string> inputs[] = {
        {"data.path", cfg.data.path},   {"data.tokenize_from", cfg.data.tokenize_from},
        {"quant.base", cfg.quant.base}, {"the parameter file", cfg.source}};
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
    // Any step may write a checkpoint (checkpoint.every, a stop signal, the
    // end): a directory that cannot hold one is refused before step 1.
    if (const std::string why = unwritable_dir_reason(cfg.checkpoint.resolved_dir); !why.empty())
      throw RankError("checkpoint.dir: '" + cfg.checkpoint.resolved_dir + "' " + why,
                      MESHLM_HERE);
    for (const auto& [key, path] : {std::pair<const char*, std::string>{"data.path", cfg.data.path},
                                    {"quant.base", cfg.quant.base}}) {
      if (path.empty() || (std::string(key) == "quant.base" && path == "init")) continue;
      if (const std::string kind = non_regular_kind(path); !kind.empty())
        throw RankError(std::string(key) + ": '" + path + "' is " + kind, MESHLM_HERE);
    }
  }, MESHLM_HERE);
}

// Collective: makes sure data.path exists, tokenizing data.tokenize_from on
// rank 0 when it does not, and opens the token file on every rank. Every id
// of the file is checked against the model's vocabulary before anything
// trains or is written: from the "max_id" attribute meshlm tokenize writes,
// else by reading the whole file (each rank a slice).
io::TokenReader open_training_data(const DataConfig& d, int vocab_size, MPI_Comm job, int rank) {
  namespace fs = std::filesystem;
  try_all(job, "data.tokenize_from: ", [&] {
    std::error_code ec;
    if (rank != 0 || fs::exists(d.path, ec) || d.tokenize_from.empty()) return;
    log::info("# tokenizing {} -> {} (byte-level, vocabulary 256)", d.tokenize_from, d.path);
    const uint64_t n = io::tokenize_bytes(d.tokenize_from, d.path);
    log::info("# {} tokens written", n);
  }, MESHLM_HERE);
  std::unique_ptr<io::TokenReader> reader;
  try_all(job, "data.path: ", [&] {
    std::error_code ec;
    if (!fs::exists(d.path, ec))
      throw RankError("token file '" + d.path + "' does not exist", MESHLM_HERE);
    reader = std::make_unique<io::TokenReader>(io::TokenReader::open(d.path));
    const int64_t declared = reader->vocab_size_attr();
    if (declared > vocab_size)
      throw RankError("token file '" + d.path + "' declares vocab_size " + std::to_string(declared) +
                          " (attribute), larger than model.vocab_size = " + std::to_string(vocab_size),
                      MESHLM_HERE);
  }, MESHLM_HERE);

  std::unique_ptr<comm::Communicator> all = comm::make_mpi_communicator(job);
  const uint64_t n = reader->size(), p = all->size(), r = all->rank();
  const uint64_t begin = n * r / p, end = n * (r + 1) / p;  // this rank's slice
  double largest = static_cast<double>(reader->max_id_attr());
  if (largest < 0) {
    // Each rank reads its slice; rank 0 shows progress on large files.
    double mine = 0;
    try_all(job, "data.path: ", [&] {
      constexpr uint64_t kPiece = 1 << 24;
      ProgressBar bar("checking token ids of " + d.path, (end - begin + kPiece - 1) / kPiece);
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
    try_all(job, "data.path: ", [&] {
      const uint64_t at = reader->first_at_least(begin, end - begin, static_cast<uint64_t>(vocab_size));
      if (at != UINT64_MAX) mine = static_cast<double>(at);
    }, MESHLM_HERE);
    all->all_reduce(&mine, &first, 1, DType::f64, comm::ReduceOp::min).wait();
    const uint64_t at = std::isfinite(first) ? static_cast<uint64_t>(first) : 0;
    int32_t id = 0;
    try_all(job, "data.path: ", [&] { reader->read(at, 1, &id); }, MESHLM_HERE);
    throw CollectiveError(fmt::format("data.path: token file '{}': position {} has id {}, >= "
                                      "vocab_size {} (model.vocab_size)",
                                      d.path, at, static_cast<uint32_t>(id), vocab_size),
                          MESHLM_HERE);
  }
  return std::move(*reader);
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

}  // namespace

TrainSummary run_training(const RunConfig& cfg, MPI_Comm job, bool for_tests) {
  const double t_start = now_seconds();
  SectionTimers timers;
  const TrainConfig& tc = cfg.train;
  const ParallelConfig& pc = cfg.parallel;

  MemTracker& tracker = MemTracker::get();
  tracker.reset_peaks();
  tracker.enter(MemPhase::startup);
  comm::set_bucket_bytes(static_cast<size_t>(cfg.comm.bucket_mb) << 20);
  const ProcessMesh mesh(job, MeshLayout(pc.dp, pc.tp, pc.pp), pc.ranks_per_node);
  const MeshCoords me = mesh.coords();
  const int rank = mesh.rank();
  std::unique_ptr<comm::Communicator> world = comm::make_mpi_communicator(mesh.world());
  const RankThreads threads = configure_threads(cfg.runtime.threads, mesh);
  const comm::WaitPolicy wait =
      cfg.comm.wait != comm::WaitPolicy::automatic ? cfg.comm.wait
      : shares_cores(threads)                      ? comm::WaitPolicy::sleep
                                                   : comm::WaitPolicy::poll;
  comm::set_wait_policy(wait);
  // Armed from the first step to the last checkpoint (collective over the
  // machine's ranks when on: their table).
  comm::StallWatchdog watchdog(mesh.world(), mesh.host(), cfg.runtime.stall_timeout_s);
  log::info("# meshlm {} | {} rank(s) = dp {} x tp {} x pp {} on {} node(s) | parameter file {}",
            MESHLM_VERSION, mesh.layout().world(), pc.dp, pc.tp, pc.pp, mesh.node_count(),
            cfg.source);
  const Backend backend(cfg.runtime.backend, mesh, tc.precision, cfg.runtime.op_timings);
  mesh.print_rank_lines(fmt::format("device {} | cores {} | threads {} | waits {}",
                                    backend.describe(), threads.cores.text(), threads.threads,
                                    name_of(wait)));

  check_run_files(cfg, mesh.world(), rank);
  io::TokenReader data = open_training_data(cfg.data, cfg.model.vocab_size, mesh.world(), rank);
  const int B = tc.micro_batch_size, T = tc.seq_len, m = pc.micro_batches;
  std::unique_ptr<io::BatchLoader> loader;
  try_all(mesh.world(), "data.path: ", [&] {
    loader = std::make_unique<io::BatchLoader>(data, B, T, cfg.data.shuffle, tc.seed,
                                               cfg.model.vocab_size, me.dp, pc.dp);
  }, MESHLM_HERE);
  log::info("# data: {} ({} tokens, {} sequences of {} per epoch)", cfg.data.path, data.size(),
            loader->windows_per_epoch(), T);

  const RankPlan shape = planned_rank_plan(cfg, mesh);
  const bool lora = shape.model.lora.enabled;
  if (!lora && !cfg.quant.cache.empty())
    log::warn("quant.cache = {} is not used: finetune.mode = full quantizes nothing", cfg.quant.cache);
  const PhasedMemory phased = predict_run_phases(cfg, shape, loader->windows_per_epoch());
  const MemoryByCategory predicted = predicted_categories(cfg, shape, phased);
  print_predicted_memory(predicted, *world);
  // The runtime's part: what is resident now outside the tracked buffers
  // (code, libraries, MPI, the heap, OpenBLAS's buffer once a GEMM of the
  // largest panel has filled it).
  ProcessPrediction expected;
  if (cfg.runtime.backend == ComputeBackend::cpu) {
    {
      Buffer scratch(ops::kGemmWarmUpFloats * sizeof(float), MemCategory::workspace,
                     "OpenBLAS warm-up", Device::cpu);
      ops::warm_up_gemm(scratch.as<float>());
    }
    const ProcessMemory now = read_process_memory();
    const size_t tracked = tracker.current_total(Device::cpu);
    expected.runtime = now.rss > tracked ? now.rss - tracked : 0;
    expected.runtime_pss = now.pss > tracked ? now.pss - tracked : 0;
    for (int p = 0; p < kNumMemPhases; ++p)
      expected.phases[p] = phased.phase_total(static_cast<MemPhase>(p));
    expected.shared = shape.shared_read_bytes;
  }
  expected.node = mesh.node_index();
  check_memory_limits(rank_demand(phased, predicted, expected), expected, mesh, cfg.memory);

  std::unique_ptr<load::FrozenBase> base;
  if (lora) {
    ScopedTimer st(timers, Section::checkpoint);
    tracker.enter(MemPhase::base_loading);
    const std::string base_name =
        cfg.quant.base.empty() ? "GPT-2 initialisation, train.seed" : cfg.quant.base;
    log::info("# base loading: {} into {} ({} of {})", base_name,
              cfg.quant.share == quant::ShareMode::per_rank ? "a private copy per rank"
                                                            : "one node-shared window per node",
              name_of(cfg.quant.type),
              format_bytes(static_cast<double>(load::make_manifest(cfg.model, cfg.quant.type).bytes)));
    base = load::FrozenBase::load(cfg.model, cfg.quant, cfg.train.seed, mesh);
    log::info("# base: {} | {} {} in {} ({} per {}) | cache {} | {:.2f} s", base_name,
              name_of(cfg.quant.type), format_bytes(static_cast<double>(base->manifest().bytes)),
              cfg.quant.share == quant::ShareMode::per_rank ? "private copies" : "node-shared windows",
              format_bytes(static_cast<double>(base->manifest().bytes)),
              cfg.quant.share == quant::ShareMode::per_rank ? "rank" : "node", base->report().cache, base->seconds());
  }

  tracker.enter(MemPhase::initialisation);
  Engine engine(cfg, mesh, timers, base.get(), backend.kernels(), backend.dequantizer());
  const LRSchedule sched{tc.lr, tc.lr_min_ratio, tc.warmup_steps, tc.steps};
  const size_t n_full = table_numel(gpt_param_table(cfg.model));
  log::info("# model: GPT-2 L={} NH={} C={} V={} (padded {}) | {} parameters ({})",
            cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.vocab_size,
            cfg.model.padded_vocab_size(), n_full,
            format_bytes(static_cast<double>(n_full) * sizeof(float)));
  if (tc.precision == ops::Precision::fp32)
    log::info("# precision: fp32{}", backend.kind() == ComputeBackend::cuda ? " (TF32 off)" : "");
  else
    log::info("# precision: {} GEMM inputs, fp32 accumulation{} | master weights, AdamW moments, "
              "activations and the other ops fp32{}",
              name_of(tc.precision),
              backend.kind() == ComputeBackend::cpu ? " (emulated on the CPU)" : "",
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
            name_of(tc.attention), pc.zero_stage, 100.0 * bubble_fraction(pc.pp, m));
  if (lora) {
    const size_t n_lora = table_numel(trainable_table(cfg.model, {}, shape.model));
    log::info("# lora: rank {} alpha {} on {} | {} trainable parameters ({:.2f}% of the base, "
              "which is frozen: no gradients, no optimizer state)",
              cfg.finetune.lora_rank, cfg.finetune.lora_alpha, slots_text(cfg.finetune.lora_targets), n_lora,
              100.0 * static_cast<double>(n_lora) / static_cast<double>(n_full));
  }
  log::info("# batch: {} sequences x {} tokens = dp {} x {} micro-batch(es) of {} | {} steps",
            tc.batch_size, T, pc.dp, m, B, tc.steps);

  // Where training starts: a checkpoint, given adapters, or step 0.
  Checkpointer checkpointer(cfg, mesh, engine, loader->windows_per_epoch(), timers);
  TrainingState state;
  TrainSummary summary;
  int64_t resumed_at = -1;  // the step of the checkpoint resumed from
  if (!cfg.checkpoint.adapters_from.empty()) checkpointer.load_adapters(cfg.checkpoint.adapters_from);
  if (const std::string from = checkpointer.resume_path(); !from.empty()) {
    state = checkpointer.load(from);
    resumed_at = state.step;
    loader->set_cursor(state.cursor);
    summary.skipped_steps = static_cast<int>(state.skipped_steps);
    summary.overflow_steps = static_cast<int>(state.overflow_steps);
    if (state.step >= tc.steps)
      log::info("# checkpoint: step {} is at or past train.steps = {}: nothing left to train",
                state.step, tc.steps);
  }

  // The run log is made once the starting point is known to be good.
  std::unique_ptr<io::RunLog> runlog;
  try_all(mesh.world(), "output.dir: ", [&] {
    if (rank != 0) return;
    runlog = std::make_unique<io::RunLog>(cfg.output.dir, cfg.resolved, reuses_output_dir(cfg),
                                          resumed_at);
    if (!cfg.layout_choice.empty()) runlog->write_layout_choice(cfg.layout_choice);
    if (runlog->carried_rows() > 0)
      log::info("# run log: {} rows of the earlier run (steps up to {}) carried over",
                runlog->carried_rows(), resumed_at);
  }, MESHLM_HERE);

  const size_t BT = static_cast<size_t>(B) * T;
  std::vector<int32_t> inputs(m * BT), targets(inputs.size());
  int skipped_in_a_row = 0;
  // One optimizer step: its data, the step, its line and its record.
  auto train_one_step = [&](int step) {
    const double t0 = now_seconds();
    {
      ScopedTimer st(timers, Section::data);
      for (int micro = 0; micro < m; ++micro)
        loader->next(inputs.data() + micro * BT, targets.data() + micro * BT);
    }
    const double lr = sched.at(step);
    const StepResult res = engine.step(inputs.data(), targets.data(), static_cast<float>(lr), step + 1);
    const double dt = now_seconds() - t0;
    if (res.overflow && !res.nonfinite) {
      // fp16: nothing was updated; the scale has halved (train/loss_scaler.h).
      ++summary.overflow_steps;
      log::warn("step {}: fp16 gradients overflowed at loss scale {:g} (loss {:.6g}, scaled "
                "gradient norm {:.6g}): step skipped, nothing updated; loss scale now {:g} ({} "
                "overflowing step(s) in all)",
                step + 1, res.loss_scale, res.loss, res.grad_norm * res.loss_scale,
                engine.loss_scaler().scale(), summary.overflow_steps);
      return;
    }
    if (res.nonfinite) {
      // Nothing was updated from this step (the engine checks before AdamW).
      ++summary.skipped_steps;
      ++skipped_in_a_row;
      const std::string what = fmt::format(
          "step {}: the loss is {:.6g} and the gradient norm is {:.6g}{}{}", step + 1, res.loss,
          res.grad_norm,
          res.overflow ? fmt::format(" at every fp16 loss scale down to {:g}", res.loss_scale)
                       : std::string(),
          res.nonfinite_tensor.empty()
              ? std::string("; every gradient is finite")
              : "; the first tensor whose gradient is not finite is " + res.nonfinite_tensor);
      if (tc.on_nonfinite == NonFinite::stop)
        throw CollectiveError(what + " (train.on_nonfinite = stop)", MESHLM_HERE);
      log::warn("{}: step skipped, nothing updated ({} in a row, {} in all)", what,
                skipped_in_a_row, summary.skipped_steps);
      if (skipped_in_a_row >= tc.max_skipped)
        throw CollectiveError(fmt::format("{} steps in a row skipped (train.max_skipped = {}); the "
                                          "last: {}",
                                          skipped_in_a_row, tc.max_skipped, what),
                              MESHLM_HERE);
      return;
    }
    skipped_in_a_row = 0;
    StepRecord r{step + 1, res.loss, lr, res.grad_norm, dt, static_cast<double>(tc.batch_size) * T / dt};
    ++summary.trained_steps;
    if (for_tests) summary.steps.push_back(r);
    if ((step + 1) % tc.log_every == 0 || step + 1 == tc.steps || step == 0) {
      log::info("  {:>6} {:>9.4f} {:>10.3e} {:>10.4f} {:>10.1f} {:>11.0f}", r.step, r.loss, r.lr,
                r.grad_norm, 1e3 * r.seconds, r.tokens_per_s);
      if (runlog) runlog->append(r.step, r.loss, r.lr, r.grad_norm, r.tokens_per_s);
    }
  };
  // After a step: a stop signal on any rank, or checkpoint.every_minutes
  // passed on rank 0's clock, makes every rank write a checkpoint.
  const StopSignals stop_signals;
  double last_save = now_seconds();
  int64_t saved_step = -1;
  auto save = [&](int64_t steps_done) {
    state.step = steps_done;
    state.tokens_seen = steps_done * static_cast<int64_t>(tc.batch_size) * T;
    state.cursor = loader->cursor();
    state.skipped_steps = summary.skipped_steps;
    state.overflow_steps = summary.overflow_steps;
    const std::string path = checkpointer.save(state);
    saved_step = steps_done;
    last_save = now_seconds();
    return path;
  };
  const CheckpointConfig& kc = cfg.checkpoint;
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
  if (watchdog.on())
    log::info("# stall watchdog: no progress for {:g} s ends the job (runtime.stall_timeout_s)",
              cfg.runtime.stall_timeout_s);
  tracker.enter(MemPhase::training);
  watchdog.arm();
  for (int step = static_cast<int>(state.step); step < tc.steps; ++step) {
    train_one_step(step);
    heartbeat::beat();
    // What every rank must agree on after the step: [stop signal, minutes due].
    std::array<int32_t, 2> mine{StopSignals::received(), 0}, any{};
    if (kc.every_minutes > 0 && rank == 0 &&
        now_seconds() - last_save >= 60.0 * kc.every_minutes)
      mine[1] = 1;
    world->all_reduce(mine.data(), any.data(), 2, DType::i32, comm::ReduceOp::max).wait();
    const int done = step + 1;
    if (any[0] != 0) {
      const std::string path = save(done);
      checkpointer.finish();  // on disk before the job ends (checkpoint.async)
      log::info("# {} received: stopped after step {} of {}; checkpoint {} written. Resume with "
                "checkpoint.resume = auto (or = {})",
                StopSignals::name(any[0]), done, tc.steps, path, path);
      summary.stopped_by_signal = any[0];
      break;
    }
    if ((kc.every > 0 && done % kc.every == 0) || any[1] != 0) save(done);
  }
  if (kc.final && summary.stopped_by_signal == 0 && saved_step != tc.steps &&
      state.step < tc.steps)
    save(tc.steps);
  {
    ScopedTimer st(timers, Section::checkpoint);
    checkpointer.finish();  // a background write still going on (checkpoint.async)
  }
  watchdog.disarm();

  summary.seconds = now_seconds() - t_start;
  if (engine.loss_scaler().enabled()) {
    summary.loss_scale = engine.loss_scaler().scale();
    log::info("# fp16 loss scaling: {} overflowing step(s) skipped | loss scale at the end {:g}",
              summary.overflow_steps, summary.loss_scale);
  }
  timers.account_rest_as_other(summary.seconds);
  const std::vector<RankMemory> mem = gather_memory(predicted, expected, *world);
  comm::release_ring_scratch();  // a run leaves nothing behind for the next
  std::vector<std::string> labels;
  for (int r = 0; r < static_cast<int>(mem.size()); ++r) {
    const MeshCoords c = mesh.layout().coords(r);
    labels.push_back(fmt::format("dp {} tp {} pp {}", c.dp, c.tp, c.pp));
  }
  print_memory_table(mem, labels);
  if (backend.kind() == ComputeBackend::cuda) {
    // Device memory (one rank): the tracked Buffers by category, and what the
    // driver reports in use on the device.
    const MemTracker& t = MemTracker::get();
    std::string cats;
    for (int c = 0; c < kNumMemCategories; ++c) {
      const size_t peak = t.peak(static_cast<MemCategory>(c), Device::cuda);
      if (peak > 0)
        cats += fmt::format(" | {} {}", mem_category_name(static_cast<MemCategory>(c)),
                            format_bytes(static_cast<double>(peak)));
    }
    log::info("# device memory, {}: tracked peak {}{} | in use on the device now {} of {} "
              "(cudaMemGetInfo)",
              backend.describe(), format_bytes(static_cast<double>(t.peak_total(Device::cuda))),
              cats, format_bytes(static_cast<double>(backend.device_used_bytes())),
              format_bytes(static_cast<double>(backend.device_total_bytes())));
  }
  print_timing_table(timers, summary.seconds, *world);
  if (backend.op_timer() != nullptr) {
    const int ran = summary.trained_steps + summary.skipped_steps +
                    summary.overflow_steps;
    print_op_timing_table(*backend.op_timer(), ran, *world);
  }
  if (for_tests) summary.final_params = engine.gather_params();
  if (runlog) {
    std::vector<MemoryByCategory> pred, cur, peak;
    std::vector<ProcessMemory> proc;
    for (const RankMemory& r : mem) {
      pred.push_back(r.predicted);
      cur.push_back(r.current);
      peak.push_back(r.peak);
      proc.push_back(r.process);
    }
    runlog->write_memory(pred, cur, peak, proc);
    std::vector<size_t> runtime, runtime_pss, peak_pred;
    std::vector<int> node;
    std::vector<double> error;
    std::vector<std::array<size_t, kNumMemPhases>> phase_pred, phase_peak;
    for (const RankMemory& r : mem) {
      runtime.push_back(r.expected.runtime);
      runtime_pss.push_back(r.expected.runtime_pss);
      node.push_back(r.expected.node);
      peak_pred.push_back(r.expected.peak());
      error.push_back(r.error());
      phase_pred.push_back(r.expected.phases);
      phase_peak.push_back(r.phase_peak);
    }
    runlog->write_process_prediction(runtime, peak_pred, error, phase_pred, phase_peak);
    std::vector<size_t> node_peaks, node_pss;
    for (const NodeMemory& n : node_memory(mem)) {
      node_peaks.push_back(n.predicted);
      node_pss.push_back(n.pss);
    }
    runlog->write_node_prediction(runtime_pss, node, node_peaks, node_pss);
    runlog->write_timing(timers);
    runlog->close();
    log::info("# run log: {}/run.h5", cfg.output.dir);
  }
  return summary;
}

}  // namespace meshlm
