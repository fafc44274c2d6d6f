// Training runs of one job under many layouts, for the tests that compare
// them with one rank (test_parallel_training, test_lora_training,
// test_llama_layouts), and the layouts they run.
//
// A run of W ranks trains on the first W ranks of MPI_COMM_WORLD (a
// sub-communicator); the others wait at the barrier that ends every run.
// Rank 0 gets the losses, the gathered final parameters and every rank's
// measured peak bytes and predicted bytes per category.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>
#include <omp.h>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "app/parameter_file.h"
#include "core/alloc.h"
#include "core/log.h"
#include "io/tokens.h"
#include "mesh/mesh.h"
#include "plan/memory.h"
#include "train/group_paths.h"
#include "train/run_shape.h"
#include "train/trainer.h"

namespace meshlm::testing {

// The jobs the layout tests train (test_parallel_training, test_lora_training,
// test_llama_layouts, and the same on the emulated device,
// test_emulated_layouts).

// L=4 so that up to 4 stages get a layer each; NH=8 so that tp=8 splits
// the heads; batch 8 of micro-batches of 1, so every layout has enough
// micro-batches for 1F1B.
inline constexpr const char* kGpt2LayoutsConfig = R"(
[model]
n_layer = 4
n_head = 8
n_embd = 32
vocab_size = 256
seq_len = 16
max_seq_len = 16
[train]
steps = 10
batch_size = 8
micro_batch_size = 1
lr = 3e-3
warmup_steps = 2
grad_clip = 1.0
seed = 7
log_every = 100
[data]
shuffle = true
)";

// NH = 8 so that tp = 8 splits the heads; C = 64 keeps NF4 blocks whole in
// some rows and split across rows in others (C / tp = 8 for tp = 8).
inline constexpr const char* kLoraLayoutsConfig = R"(
[model]
n_layer = 4
n_head = 8
n_embd = 64
vocab_size = 256
seq_len = 16
max_seq_len = 16
[train]
steps = 8
batch_size = 8
micro_batch_size = 1
lr = 1e-2
warmup_steps = 2
weight_decay = 0.01
grad_clip = 1.0
seed = 21
log_every = 100
[finetune]
mode = lora
lora_rank = 4
lora_alpha = 8
[quant]
type = nf4
share = node
[data]
shuffle = true
)";

// A Llama of two key/value heads for eight query heads: tp 2 splits them,
// tp 4 and 8 replicate them.
inline constexpr const char* kLlamaLayoutsConfig = R"(
[model]
arch = llama
n_layer = 4
n_head = 8
n_kv_head = 2
n_embd = 32
intermediate_size = 48
vocab_size = 256
seq_len = 16
max_seq_len = 16
norm_eps = 1e-5
rope_theta = 500000
rope_factor = 8
rope_original_max_positions = 8
tie_word_embeddings = false
[train]
steps = 8
batch_size = 8
micro_batch_size = 1
lr = 3e-3
warmup_steps = 2
grad_clip = 1.0
seed = 11
log_every = 100
[finetune]
lora_rank = 4
lora_alpha = 8
[quant]
type = nf4
[data]
shuffle = true
)";

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

struct RunResult {
  std::vector<double> losses;
  std::vector<EvalRecord> evals;  // train.eval_every's held-out losses
  std::vector<float> params;  // the trained parameters, gathered on rank 0
  std::vector<MemoryByCategory> peaks, predicted;  // per rank of the run, on rank 0
  // The host's tracked total at its training-phase peak, measured and
  // predicted (PhasedMemory::phase_total), per rank of the run, on rank 0.
  std::vector<size_t> training_peak, training_predicted;
};

// Collective over the world: a fresh directory made by rank 0 (its name
// broadcast) holding tokens.h5, the GPL-3 text tokenized byte-level.
inline std::filesystem::path make_run_dir(const char* prefix) {
  namespace fs = std::filesystem;
  char name[4096] = {0};
  if (world_rank() == 0) {
    std::string tmpl = (fs::temp_directory_path() / (std::string(prefix) + "_XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) {  // no ASSERT here: the others wait in Bcast
      std::perror("mkdtemp");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    std::snprintf(name, sizeof(name), "%s", tmpl.c_str());
    io::tokenize_bytes("/usr/share/common-licenses/GPL-3", (fs::path(name) / "tokens.h5").string());
  }
  MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, MPI_COMM_WORLD);
  return name;
}

// MPI_Barrier for ranks that may wait long: a rank left out of a run on the
// first ranks tests a non-blocking barrier every half millisecond instead of
// polling inside MPI_Barrier. With 8 ranks on 2 cores, the polling ranks
// (Open MPI yields when oversubscribed, but keeps polling) took about as much
// CPU time as the ranks that train.
inline void idle_barrier(MPI_Comm comm) {
  MPI_Request req;
  MPI_Ibarrier(comm, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

// Collective over the world.
inline void remove_run_dir(const std::filesystem::path& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

// Collective over the world: trains `config_text` with `overrides` (the
// layout among them) on the first `w` ranks, reading dir/tokens.h5.
inline RunResult train_on_first_ranks(const char* config_text,
                                      std::vector<std::string> overrides, int w,
                                      const std::filesystem::path& dir) {
  RunResult res;
  if (w > world_size()) return res;
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < w ? 0 : MPI_UNDEFINED, world_rank(), &sub);
  if (sub != MPI_COMM_NULL) {
    overrides.insert(overrides.begin(),
                     {"--data.path=" + (dir / "tokens.h5").string(),
                      "--output.dir=" + (dir / ("run" + std::to_string(w))).string(),
                      "--output.overwrite=true",  // runs of one width share a directory
                      "--checkpoint.final=false",  // a test that wants one says so
                      // Open MPI's polling waits: these models are so small that
                      // a step is latency, and comm.wait = sleep (what auto takes
                      // on 8 ranks of 2 cores) made each wait up to 0.5 ms late:
                      // the Llama layouts took 22.6 s instead of 6.1. Both
                      // policies give the same bits (test_comm,
                      // cli_sleeping_waits_same_losses).
                      "--comm.wait=poll"});
    const RunConfig cfg = parse_run_config(config_text, "test", overrides, w);
    MemTracker::get().reset_peaks();
    const int saved = log::rank();
    log::set_rank(1);  // quiet: the tables of many runs say nothing here
    const TrainSummary s = run_training(cfg, sub, debug::Records::every_step);
    log::set_rank(saved);
    for (const StepRecord& r : s.steps) res.losses.push_back(r.loss);
    res.evals = s.evals;
    res.params = s.final_params;
    // Host and device together, as the run's table adds them (one of the
    // two is 0 but for a device backend's staging and copies).
    MemoryByCategory peak{};
    for (int c = 0; c < kNumMemCategories; ++c)
      peak[c] = MemTracker::get().peak(static_cast<MemCategory>(c), Device::cpu) +
                MemTracker::get().peak(static_cast<MemCategory>(c), Device::cuda);
    // The prediction as the trainer makes it, on a mesh of the same shape.
    const ParallelConfig& p = cfg.parallel;
    const ProcessMesh mesh(sub, MeshLayout(p.dp, p.tp, p.pp), p.ranks_per_node);
    const io::TokenReader reader = io::TokenReader::open((dir / "tokens.h5").string());
    const uint64_t windows = (reader.size() - 1) / cfg.train.seq_len;
    const RankPlan rank_plan = planned_rank_plan(cfg, mesh);
    // The groups' paths from the ranks' GPUs (the emulated device's, as
    // train/backend.cpp numbers them; none on the CPU).
    const GroupPaths paths = gather_group_paths(
        cfg, mesh, emulated_device_ordinal(mesh.node_rank(), cfg.cluster.gpus_per_node));
    // (The run has set this process's OpenMP threads to its rank's.)
    const RunMemoryOptions mo = memory_options(cfg, windows, paths, omp_get_max_threads());
    const PhasedMemory phased = predict_run_phases(cfg.model, rank_plan, mo);
    const MemoryByCategory pred = predicted_categories(cfg.model, rank_plan, mo, phased);
    const int r = mesh.rank();
    res.peaks.resize(r == 0 ? w : 0);
    res.predicted.resize(r == 0 ? w : 0);
    MPI_Gather(&peak, sizeof(peak), MPI_BYTE, res.peaks.data(), sizeof(peak), MPI_BYTE, 0, sub);
    MPI_Gather(&pred, sizeof(pred), MPI_BYTE, res.predicted.data(), sizeof(pred), MPI_BYTE, 0,
               sub);
    const unsigned long long training[2] = {
        MemTracker::get().phase_peak(MemPhase::training), phased.phase_total(MemPhase::training)};
    std::vector<unsigned long long> all(r == 0 ? 2 * w : 0);
    MPI_Gather(training, 2, MPI_UNSIGNED_LONG_LONG, all.data(), 2, MPI_UNSIGNED_LONG_LONG, 0, sub);
    for (size_t q = 0; q < all.size(); q += 2) {
      res.training_peak.push_back(all[q]);
      res.training_predicted.push_back(all[q + 1]);
    }
    MPI_Comm_free(&sub);
  }
  idle_barrier(MPI_COMM_WORLD);
  return res;
}

// Norm-wise relative error ||a - ref|| / ||ref||. Layouts sum in different
// orders (TP and DP reductions), so values differ in the last bits; AdamW
// then moves an element whose gradient is at rounding level by up to lr per
// step in either direction, which an element-wise relative error would
// report as a large error of a few meaningless elements.
inline double norm_rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    diff += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);
}

// The worst element against the largest reference value (printed only).
inline double max_rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - ref[i]));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return diff / scale;
}

// The worst relative difference of two loss curves of the same length.
inline double worst_loss_rel(const std::vector<double>& a, const std::vector<double>& ref) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - ref[i]) / std::abs(ref[i]));
  return worst;
}

// A layout of the mesh and how a run uses it.
struct Layout {
  int dp, tp, pp, zero;
  const char* schedule;
  const char* ckpt;
  int ranks_per_node = 0;     // 0: the machine's
  const char* share = "node";  // quant.share (LoRA)
  int ranks() const { return dp * tp * pp; }
  std::string name() const {
    std::string s = "dp" + std::to_string(dp) + " tp" + std::to_string(tp) + " pp" +
                    std::to_string(pp) + " zero" + std::to_string(zero) + " " + schedule +
                    " ckpt=" + ckpt;
    if (ranks_per_node > 0) s += " rpn=" + std::to_string(ranks_per_node);
    if (std::string(share) != "node") s += std::string(" ") + share;
    return s;
  }
  // The parameter-file overrides (the quant.share only where it is not the default).
  std::vector<std::string> overrides() const {
    std::vector<std::string> o = {"--parallel.dp=" + std::to_string(dp),
                                  "--parallel.tp=" + std::to_string(tp),
                                  "--parallel.pp=" + std::to_string(pp),
                                  "--parallel.zero_stage=" + std::to_string(zero),
                                  "--parallel.schedule=" + std::string(schedule),
                                  "--parallel.activation_checkpointing=" + std::string(ckpt),
                                  "--parallel.ranks_per_node=" + std::to_string(ranks_per_node)};
    if (std::string(share) != "node") o.push_back("--quant.share=" + std::string(share));
    return o;
  }
};

// The 25 layouts of full training on 2, 4 and 8 ranks: every axis alone and
// together, ZeRO 0/1/2, GPipe and 1F1B, activation checkpointing.
inline const std::vector<Layout>& parallel_layouts() {
  static const std::vector<Layout> layouts = {
      // 2 ranks
      {2, 1, 1, 0, "1f1b", "none"},
      {1, 2, 1, 0, "1f1b", "full"},
      {1, 1, 2, 0, "1f1b", "none"},
      {1, 1, 2, 0, "gpipe", "full"},
      {2, 1, 1, 2, "1f1b", "none"},
      // 4 ranks
      {4, 1, 1, 1, "1f1b", "none"},
      {4, 1, 1, 2, "1f1b", "full"},
      {1, 4, 1, 0, "1f1b", "none"},
      {1, 1, 4, 0, "1f1b", "none"},
      {1, 1, 4, 0, "gpipe", "none"},
      {2, 2, 1, 2, "1f1b", "none"},
      {2, 1, 2, 1, "gpipe", "none"},
      {1, 2, 2, 0, "1f1b", "full"},
      {2, 1, 2, 2, "1f1b", "full"},
      // 8 ranks
      {2, 2, 2, 0, "1f1b", "none"},
      {2, 2, 2, 1, "gpipe", "full"},
      {2, 2, 2, 2, "1f1b", "full"},
      {2, 2, 2, 1, "1f1b", "none"},
      {8, 1, 1, 2, "1f1b", "none"},
      {1, 8, 1, 0, "gpipe", "none"},
      {4, 2, 1, 1, "1f1b", "none"},
      {2, 4, 1, 2, "1f1b", "full"},
      {1, 2, 4, 0, "gpipe", "none"},
      {4, 1, 2, 2, "1f1b", "none"},
      {2, 1, 4, 1, "1f1b", "full"},
  };
  return layouts;
}

// The layouts of LoRA on a node-shared quantized base: besides the axes,
// machines split into nodes (ranks_per_node) and a private copy per rank.
inline const std::vector<Layout>& lora_layouts() {
  static const std::vector<Layout> layouts = {
      {2, 1, 1, 0, "1f1b", "none"},
      {1, 2, 1, 0, "1f1b", "full"},
      {1, 1, 2, 0, "gpipe", "none"},
      {2, 2, 1, 2, "1f1b", "none"},
      {1, 2, 2, 0, "1f1b", "none", 2},
      {2, 2, 2, 0, "1f1b", "none"},
      {2, 2, 2, 1, "gpipe", "full", 4},
      {2, 2, 2, 2, "1f1b", "none", 2, "per_rank"},
      {1, 8, 1, 0, "gpipe", "none"},
      {4, 2, 1, 1, "1f1b", "none", 4},
      {1, 2, 4, 0, "gpipe", "none"},
      {8, 1, 1, 2, "1f1b", "none", 1},
  };
  return layouts;
}

// Every category of every rank: the tracked allocator's peak is the prediction.
inline void expect_predicted_exactly(const RunResult& r) {
  for (size_t q = 0; q < r.peaks.size(); ++q)
    for (int c = 0; c < kNumMemCategories; ++c)
      EXPECT_EQ(r.peaks[q][c], r.predicted[q][c])
          << "rank " << q << " category " << mem_category_name(static_cast<MemCategory>(c));
}

// Collective over the world: trains `config_text` with `extra` on one rank
// and with `extra` and `layout_extra` in every layout of `layouts`; on rank
// 0 each layout's losses are the one rank's within `tol` relative (1e-5:
// fp32), its gathered final parameters (or adapters) within `tol`
// norm-wise, every
// rank's memory its prediction per category; and the one-rank loss falls by
// `fall` (a run that learns).
inline void expect_layouts_match_one_rank(const char* config_text,
                                          const std::filesystem::path& dir,
                                          const std::vector<Layout>& layouts,
                                          const std::vector<std::string>& extra,
                                          const std::vector<std::string>& layout_extra,
                                          double fall, double tol = 1e-5) {
  ASSERT_EQ(world_size(), 8) << "run this test on 8 ranks";
  const RunResult ref = train_on_first_ranks(config_text, extra, 1, dir);
  for (const Layout& l : layouts) {
    std::vector<std::string> o = l.overrides();
    o.insert(o.end(), extra.begin(), extra.end());
    o.insert(o.end(), layout_extra.begin(), layout_extra.end());
    const RunResult r = train_on_first_ranks(config_text, o, l.ranks(), dir);
    if (world_rank() != 0) continue;
    SCOPED_TRACE(l.name());
    ASSERT_EQ(r.losses.size(), ref.losses.size());
    const double worst = worst_loss_rel(r.losses, ref.losses);
    EXPECT_LE(worst, tol);
    ASSERT_EQ(r.params.size(), ref.params.size());
    const double prel = norm_rel(r.params, ref.params);
    EXPECT_LE(prel, tol);
    expect_predicted_exactly(r);
    std::printf("  %-48s loss rel %.2e  params rel %.2e\n", l.name().c_str(), worst, prel);
  }
  if (world_rank() == 0) EXPECT_LT(ref.losses.back(), ref.losses.front() - fall);
}

}  // namespace meshlm::testing
