// Distributed training equals training on one rank: for a covering set of
// layouts (dp, tp, pp) with dp*tp*pp in {2, 4, 8}, across ZeRO 0/1/2, GPipe
// and 1F1B, activation checkpointing none/full, 10 steps give the single-rank
// losses within 1e-5 relative and the same final parameters (gathered to
// their logical shapes) within 1e-5; and the memory each rank holds is what
// the layout promises, measured on the tracked allocator.
//
// Each layout runs on the first W ranks of the job (a sub-communicator);
// the other ranks wait. Rank 0 compares.
// meshlm-test-ranks: 8
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "app/parameter_file.h"
#include "comm/mpi_comm.h"
#include "core/alloc.h"
#include "model/gpt.h"
#include "ops/precision.h"
#include "mpi/training_runs.h"
#include "plan/memory.h"
#include "plan/rank_plan.h"
#include "mesh/mesh.h"
#include "plan/partition.h"

using namespace meshlm;
using namespace meshlm::testing;
namespace fs = std::filesystem;

namespace {


class ParallelTraining : public ::testing::Test {
protected:
  static void SetUpTestSuite() { dir_ = make_run_dir("meshlm_parallel"); }
  static void TearDownTestSuite() { remove_run_dir(dir_); }

  // Collective over the world: trains `l` on the first dp*tp*pp ranks.
  static RunResult train(const Layout& l) {
    return train_on_first_ranks(kGpt2LayoutsConfig, l.overrides(), l.ranks(), dir_);
  }

  static const RunResult& reference() {
    static const RunResult ref = train({1, 1, 1, 0, "1f1b", "none"});
    return ref;
  }

  static fs::path dir_;
};
fs::path ParallelTraining::dir_;

constexpr double kLossTol = 1e-5;
constexpr double kParamTol = 1e-5;

}  // namespace

// Under the sanitizers (CI's second build, which looks for memory errors
// and undefined behaviour, not for other numbers), five of the 25 layouts:
// every axis and pair of axes, pp 4, ZeRO 1 and 2, both schedules and
// checkpointing. The ordinary build runs all 25.
namespace {
std::vector<Layout> layouts_to_run() {
#ifdef MESHLM_TEST_SANITIZED
  std::vector<Layout> some;
  for (const size_t i : {1, 10, 15, 16, 24})
    some.push_back(parallel_layouts().at(i));
  return some;
#else
  return parallel_layouts();
#endif
}
}  // namespace

TEST_F(ParallelTraining, EveryLayoutMatchesOneRank) {
  ASSERT_EQ(world_size(), 8) << "run this test on 8 ranks";
  const RunResult& ref = reference();
  for (const Layout& l : layouts_to_run()) {
    const RunResult r = train(l);
    if (world_rank() != 0) continue;
    SCOPED_TRACE(l.name());
    ASSERT_EQ(r.losses.size(), ref.losses.size());
    const double worst = worst_loss_rel(r.losses, ref.losses);
    EXPECT_LE(worst, kLossTol);
    ASSERT_EQ(r.params.size(), ref.params.size());
    const double prel = norm_rel(r.params, ref.params);
    EXPECT_LE(prel, kParamTol);
    std::printf("  %-38s loss rel %.2e  params rel %.2e (worst element %.2e)\n",
                l.name().c_str(), worst, prel, max_rel(r.params, ref.params));
    // The loss moved: the comparison is of a run that learns.
    EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.1);
  }
}

// comm.overlap = on: ZeRO 0/1 reduce the gradients over dp in buckets of
// whole layers while the last micro-batch's backward runs (C = 256: each
// layer's 0.79 M gradients, 3 MiB, are a bucket of their own at 1 MiB), the
// embeddings and the final norm after it. Against one rank, on the CPU and
// on the emulated device (host staging), with every rank's memory predicted.
// Under the sanitizers, the two layouts that hold the others' features (ZeRO
// 1 with checkpointing; dp x pp), the second of them on the emulated device.
TEST_F(ParallelTraining, DpReductionOverlappedWithTheBackwardMatchesOneRank) {
  const Layout zero_ckpt{2, 1, 1, 1, "1f1b", "full"}, dp_pp{4, 1, 2, 1, "1f1b", "none"};
#ifdef MESHLM_TEST_SANITIZED
  const std::vector<Layout> layouts = {zero_ckpt, dp_pp}, emulated = {dp_pp};
#else
  const std::vector<Layout> layouts = {{2, 1, 1, 0, "1f1b", "none"}, zero_ckpt,
                                       {2, 2, 1, 1, "1f1b", "none"}, {2, 1, 2, 0, "gpipe", "none"},
                                       dp_pp},
                            emulated = {zero_ckpt, dp_pp};
#endif
  const std::vector<std::string> job = {"--model.n_embd=256", "--comm.bucket_mb=1",
                                        "--train.steps=4"};
  expect_layouts_match_one_rank(kGpt2LayoutsConfig, dir_, layouts, job, {"--comm.overlap=on"},
                                0.05);
  expect_layouts_match_one_rank(kGpt2LayoutsConfig, dir_, emulated, job,
                                {"--comm.overlap=on", "--runtime.backend=emulated",
                                 "--comm.device=host"},
                                0.05);
}

// ZeRO 2 under pp: each stage reduces its part of the tied embedding's
// gradient into its own DP shards, which cut wte at other places on the two
// stages once wte is larger than a shard (V = 1000: wte has 32768 elements,
// a shard of dp 4 about 14600 on either stage), so the last stage's owners
// send pieces to first-stage owners of other DP ranks. The run still equals
// one rank.
TEST_F(ParallelTraining, ZeroTwoMovesTheTiedEmbeddingBetweenStageShards) {
  const std::vector<std::string> vocab = {"--model.vocab_size=1000"};
  auto run = [&](const Layout& l) {
    std::vector<std::string> o = vocab;
    for (const std::string& s :
         {"--parallel.dp=" + std::to_string(l.dp), "--parallel.tp=" + std::to_string(l.tp),
          "--parallel.pp=" + std::to_string(l.pp), "--parallel.zero_stage=" + std::to_string(l.zero),
          "--parallel.schedule=" + std::string(l.schedule),
          "--parallel.activation_checkpointing=" + std::string(l.ckpt)})
      o.push_back(s);
    return train_on_first_ranks(kGpt2LayoutsConfig, o, l.dp * l.tp * l.pp, dir_);
  };
  const RunResult ref = run({1, 1, 1, 0, "1f1b", "none"});
  for (const Layout& l : {Layout{4, 1, 2, 2, "1f1b", "none"}, Layout{2, 1, 4, 2, "gpipe", "full"},
                          Layout{2, 2, 2, 2, "1f1b", "none"}}) {
    const RunResult r = run(l);
    if (world_rank() != 0) continue;
    SCOPED_TRACE(l.name());
    EXPECT_LE(worst_loss_rel(r.losses, ref.losses), kLossTol);
    EXPECT_LE(norm_rel(r.params, ref.params), kParamTol);
    EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.1);
  }
}

TEST_F(ParallelTraining, SameLayoutSameBits) {
  const Layout l{2, 2, 2, 2, "1f1b", "full"};
  const RunResult a = train(l), b = train(l);
  if (world_rank() != 0) return;
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.params, b.params);
}

// A long run kept one record a step (the soak benchmark, tests/bench/soak.py,
// saw its memory grow by 44 bytes a step); only tests ask for them now.
TEST_F(ParallelTraining, OnlyTestsKeepARecordPerStep) {
  MPI_Comm one;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &one);
  if (one != MPI_COMM_NULL) {
    const RunConfig cfg = parse_run_config(
        kGpt2LayoutsConfig, "t",
        {"--data.path=" + (dir_ / "tokens.h5").string(), "--output.dir=" + (dir_ / "records").string(),
         "--output.overwrite=true", "--checkpoint.final=false"},
        1);
    const int saved = log::rank();
    log::set_rank(1);
    const TrainSummary plain = run_training(cfg, one);
    const TrainSummary kept = run_training(cfg, one, debug::Records::every_step);
    log::set_rank(saved);
    EXPECT_TRUE(plain.steps.empty());
    EXPECT_EQ(plain.trained_steps, cfg.train.steps);
    ASSERT_EQ(kept.steps.size(), static_cast<size_t>(cfg.train.steps));
    EXPECT_EQ(kept.steps.back().step, cfg.train.steps);
    MPI_Comm_free(&one);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(ParallelTraining, MemoryPerRankIsPredictedExactly) {
  for (const Layout& l : {Layout{2, 2, 2, 0, "1f1b", "none"}, Layout{2, 2, 2, 2, "gpipe", "full"},
                          Layout{4, 1, 2, 1, "1f1b", "full"}}) {
    const RunResult r = train(l);
    if (world_rank() != 0) continue;
    SCOPED_TRACE(l.name());
    expect_predicted_exactly(r);
  }
}

TEST_F(ParallelTraining, ZeroShardsOptimizerAndGradients) {
  const RunResult one = train({1, 1, 1, 0, "1f1b", "none"});
  const RunResult z0 = train({4, 1, 1, 0, "1f1b", "none"});
  const RunResult z1 = train({4, 1, 1, 1, "1f1b", "none"});
  const RunResult z2 = train({4, 1, 1, 2, "1f1b", "none"});
  if (world_rank() != 0) return;
  auto at = [](const RunResult& r, int q, MemCategory c) { return r.peaks[q][static_cast<int>(c)]; };
  const size_t n = table_numel(gpt_param_table(
      parse_run_config(kGpt2LayoutsConfig, "t", {"--data.path=x"}).model));
  const size_t shard = (n + 3) / 4;  // the flat buffer padded to a multiple of dp = 4
  EXPECT_EQ(at(one, 0, MemCategory::optimizer), 2 * n * sizeof(float));
  for (int q = 0; q < 4; ++q) {
    // ZeRO 0 replicates AdamW's moments; ZeRO 1 and 2 keep 1/dp of them.
    EXPECT_EQ(at(z0, q, MemCategory::optimizer), at(one, 0, MemCategory::optimizer));
    EXPECT_EQ(at(z1, q, MemCategory::optimizer), 2 * shard * sizeof(float));
    EXPECT_EQ(at(z2, q, MemCategory::optimizer), 2 * shard * sizeof(float));
    // Gradients: whole under ZeRO 0/1; under ZeRO 2 the shard, a bucket of
    // one block or of all of wte's rows (the classifier's logits of these
    // 8 tokens hold them all), wpe and the final norm.
    EXPECT_EQ(at(z1, q, MemCategory::grads), 4 * shard * sizeof(float));
    EXPECT_LT(at(z2, q, MemCategory::grads), at(z1, q, MemCategory::grads));
    const GPTConfig model = parse_run_config(kGpt2LayoutsConfig, "t", {"--data.path=x"}).model;
    const std::vector<ParamSpec> table = gpt_param_table(model);
    const size_t wte = static_cast<size_t>(model.padded_vocab_size()) * model.n_embd;
    EXPECT_EQ(at(z2, q, MemCategory::grads),
              (shard + std::max(largest_block_numel(table), wte) + edge_numel(table)) *
                  sizeof(float));
  }
}

TEST_F(ParallelTraining, TiedEmbeddingMomentsLiveOnTheFirstStageOnly) {
  // Under pp the last stage computes the lm_head with its copy of wte, but
  // AdamW's moments of wte are the first stage's alone: the last stage holds
  // moments for its other elements (of its ZeRO shard) only.
  const GPTConfig model = parse_run_config(kGpt2LayoutsConfig, "t", {"--data.path=x"}).model;
  for (const Layout& l : {Layout{1, 1, 2, 0, "1f1b", "none"}, Layout{2, 1, 2, 1, "1f1b", "none"},
                          Layout{2, 2, 2, 2, "gpipe", "none"}, Layout{1, 1, 4, 0, "1f1b", "none"}}) {
    const RunResult r = train(l);
    if (world_rank() != 0) continue;
    SCOPED_TRACE(l.name());
    const MeshLayout mesh(l.dp, l.tp, l.pp);
    ParallelConfig par;
    par.dp = l.dp;
    par.tp = l.tp;
    par.pp = l.pp;
    const std::vector<int> bounds = stage_bounds(stage_layers(model, par, 16));
    for (int q = 0; q < mesh.world(); ++q) {
      const MeshCoords c = mesh.coords(q);
      const ModelShard shard{.tp_rank = c.tp, .tp_size = l.tp, .layer_begin = bounds[c.pp],
                             .layer_end = bounds[c.pp + 1], .first_stage = c.pp == 0,
                             .last_stage = c.pp == l.pp - 1};
      const std::vector<ParamSpec> table = gpt_param_table(model, shard);
      const size_t n = table_numel(table), dp = static_cast<size_t>(l.dp);
      const size_t padded = l.zero > 0 ? (n + dp - 1) / dp * dp : n;
      size_t begin = l.zero > 0 ? c.dp * (padded / dp) : 0,
             end = l.zero > 0 ? begin + padded / dp : n;
      if (shard.last_stage && !shard.first_stage) {
        ASSERT_EQ(table[0].name, "wte.weight");
        begin = std::min(std::max(begin, table[0].numel()), end);  // no moments of wte here
      }
      EXPECT_EQ(r.peaks[q][static_cast<int>(MemCategory::optimizer)],
                2 * (end - begin) * sizeof(float))
          << "rank " << q;
    }
  }
}

TEST_F(ParallelTraining, TiedEmbeddingReduceScratchIsPredictedExactly) {
  // A vocabulary of 40000 makes wte (40000 x 32 floats, 4.9 MiB) go through
  // the ring's chain reduce onto the first stage: its scratch is the first
  // stage's alone, and every category of every rank is as predicted.
  const RunResult r = train_on_first_ranks(
      kGpt2LayoutsConfig, {"--model.vocab_size=40000", "--parallel.pp=2", "--parallel.dp=2",
                "--parallel.zero_stage=1", "--train.steps=2"},
      4, dir_);
  if (world_rank() != 0) return;
  expect_predicted_exactly(r);
  // Ranks 0, 1 are the first stage, 2, 3 the last (pp is the slowest coordinate).
  EXPECT_GT(r.peaks[0][static_cast<int>(MemCategory::comm)], 0u);
  EXPECT_LT(r.peaks[2][static_cast<int>(MemCategory::comm)], r.peaks[0][static_cast<int>(MemCategory::comm)]);
}

TEST_F(ParallelTraining, LargeEmbeddingUnderTpAndZeroTwoIsPredictedExactly) {
  // wte's TP shard (20000 x 32 floats) is far larger than any all-reduce over
  // tp (the activations, N x C): full training sums no parameter over tp, so
  // the tp scratch is the activations'. Under ZeRO 2 the reduce of each
  // piece has its scratch on every rank of its chain but the first: the two
  // DP ranks of a group book different comm bytes, each as predicted.
  const RunResult r = train_on_first_ranks(
      kGpt2LayoutsConfig, {"--model.vocab_size=40000", "--parallel.tp=2", "--parallel.dp=2",
                "--parallel.zero_stage=2", "--train.steps=2"},
      4, dir_);
  if (world_rank() != 0) return;
  expect_predicted_exactly(r);
}

// train.precision bf16 / fp16 on the CPU's ops: every GEMM rounds its
// inputs a tile at a time into the scratch of its rank's threads
// (ops::RoundingScratch), tracked as workspace from the start of training and
// predicted exactly, on the CPU and on the emulated device; at fp32 none.
TEST_F(ParallelTraining, RoundedGemmScratchIsPredictedExactly) {
  const std::vector<std::string> bf16_3d = {"--train.precision=bf16", "--parallel.dp=2",
                                            "--parallel.tp=2", "--parallel.pp=2",
                                            "--train.steps=2"};
  const std::vector<std::string> fp16_emulated = {
      "--train.precision=fp16", "--parallel.dp=2", "--parallel.zero_stage=2",
      "--runtime.backend=emulated", "--comm.device=host", "--runtime.threads=1",
      "--train.steps=2"};
  const std::vector<std::string> fp32 = {"--parallel.tp=2", "--train.steps=2"};
  for (const auto& [extra, ranks] : {std::pair{bf16_3d, 8}, std::pair{fp16_emulated, 2},
                                     std::pair{fp32, 2}}) {
    const RunResult r = train_on_first_ranks(kGpt2LayoutsConfig, extra, ranks, dir_);
    if (world_rank() != 0) continue;
    SCOPED_TRACE(extra.front());
    expect_predicted_exactly(r);
    if (extra == fp16_emulated) {
      // No OpenBLAS warm-up there, and tp 1: the host's workspace is the
      // scratch alone, of its one thread.
      EXPECT_EQ(r.peaks[0][static_cast<int>(MemCategory::workspace)],
                ops::rounding_scratch_bytes(1));
      continue;
    }
    // On the CPU the tracked total at the peak of training, as predicted:
    // the scratch is in it (but at fp32), where the category's peak is the
    // start-up's OpenBLAS warm-up (8 MiB).
    ASSERT_EQ(r.training_peak.size(), size_t(ranks));
    for (int q = 0; q < ranks; ++q)
      EXPECT_EQ(r.training_peak[q], r.training_predicted[q]) << "rank " << q;
  }
}

TEST_F(ParallelTraining, TensorParallelismHalvesSplitMatrices) {
  const RunResult one = train({1, 1, 1, 0, "1f1b", "none"});
  const RunResult tp2 = train({1, 2, 1, 0, "1f1b", "none"});
  if (world_rank() != 0) return;
  const GPTConfig model = parse_run_config(kGpt2LayoutsConfig, "t", {"--data.path=x"}).model;
  size_t split = 0, replicated = 0, split_matrices = 0, matrices = 0;
  for (const ParamSpec& p : gpt_param_table(model)) {
    (p.tp_dim >= 0 ? split : replicated) += p.numel();
    if (p.decay()) {
      matrices += p.numel();
      if (p.tp_dim >= 0) split_matrices += p.numel();
    }
  }
  // Every matrix but the position table is split (wpe is small and replicated).
  EXPECT_EQ(matrices - split_matrices,
            static_cast<size_t>(model.max_seq_len) * model.n_embd);
  const size_t p1 = one.peaks[0][static_cast<int>(MemCategory::params)];
  EXPECT_EQ(p1, (split + replicated) * sizeof(float));
  for (int q = 0; q < 2; ++q)
    EXPECT_EQ(tp2.peaks[q][static_cast<int>(MemCategory::params)],
              (split / 2 + replicated) * sizeof(float));
}

TEST(TensorParallelInit, HoldsOneBlockOfASplitTensorAndTheSameValues) {
  // wte (2048 x 1024 floats, 8 MiB) is twice GPT::kWeightBlockBytes: each
  // rank of a tensor-parallel pair (ranks 0 and 1; the others wait)
  // initialises it through one block-sized buffer and holds what its part
  // of the whole tensor holds.
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ASSERT_GE(world, 2);
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &pair);
  if (pair != MPI_COMM_NULL) {
    std::unique_ptr<comm::Communicator> tp = comm::make_mpi_communicator(pair);
    const GPTConfig c{.n_layer = 1, .n_head = 4, .n_embd = 1024, .vocab_size = 2048,
                      .max_seq_len = 8};
    const int t = tp->rank();
    MemTracker::get().reset_peaks();
    const size_t before = MemTracker::get().peak(MemCategory::workspace);
    GPT m(c, {.tp_rank = t, .tp_size = 2}, {}, tp.get());
    m.init_weights(7);
    const size_t used = MemTracker::get().peak(MemCategory::workspace) - before;
    EXPECT_EQ(used, GPT::weight_block_bytes(m.table(), 2, /*host=*/true));
    EXPECT_LE(used, GPT::kWeightBlockBytes);
    for (const ParamSpec& p : m.table()) {
      std::vector<float> whole(static_cast<size_t>(p.full_shape.numel())), part(p.numel());
      init_tensor(c, p, 7, whole.data());
      shard_from_full(p, whole.data(), part.data(), t, 2);
      const std::span<float> got = m.param(p.name);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), part.begin())) << p.name << " rank " << t;
    }
    MPI_Comm_free(&pair);
  }
  idle_barrier(MPI_COMM_WORLD);
}
