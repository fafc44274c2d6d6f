// Validation loss (train.eval_every, train.eval_batches, data.val_path):
//  * the same held-out loss, at the same steps, under every kind of layout
//    (dp, tp, pp, GPipe and 1F1B, ZeRO 1/2, activation checkpointing, LoRA
//    on an NF4 base), GPT-2 and Llama, within 1e-5 relative of one rank;
//    every rank's memory still its prediction, category by category;
//  * evaluation changes nothing of training: the losses and the final
//    parameters of a run with it are those of the run without, bit for bit;
//  * it evaluates what it says: the held-out loss equals the mean training
//    loss of a run on the held-out tokens themselves, in file order, at a
//    learning rate of 1e-30 (the same windows, the same weights).
// The held-out tokens come from data.path's dataset /val_tokens (as meshlm
// tokenize --val-fraction writes it) or from data.val_path.
// meshlm-test-ranks: 8
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "io/h5.h"
#include "io/tokens.h"
#include "training_runs.h"

using namespace meshlm;
using namespace meshlm::testing;
namespace fs = std::filesystem;

namespace {

// test_parallel_training's model: L=4 for 4 stages, NH=8 for tp=8, batch 8
// of micro-batches of 1. Evaluations after steps 2 and 4 (the last), each
// over 2 global batches of 8 held-out windows.
const char* kGpt2 = R"(
[model]
n_layer = 4
n_head = 8
n_embd = 32
vocab_size = 256
seq_len = 16
max_seq_len = 16
[train]
steps = 4
batch_size = 8
micro_batch_size = 1
lr = 3e-3
warmup_steps = 2
grad_clip = 1.0
seed = 7
log_every = 100
eval_every = 2
eval_batches = 2
[finetune]
lora_rank = 4
lora_alpha = 8
[quant]
type = nf4
[data]
shuffle = true
)";

// test_llama_layouts' model: grouped-query heads (split over tp 2,
// replicated over tp 4 and 8), rope scaling, an untied classifier.
const char* kLlama = R"(
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
rope_theta = 500000
rope_factor = 8
rope_original_max_positions = 8
tie_word_embeddings = false
[train]
steps = 4
batch_size = 8
micro_batch_size = 1
lr = 3e-3
warmup_steps = 2
seed = 11
log_every = 100
eval_every = 3
eval_batches = 2
[finetune]
lora_rank = 4
lora_alpha = 8
[quant]
type = nf4
[data]
shuffle = true
)";

constexpr double kTol = 1e-5;

// A covering set of the layouts of tests/mpi/training_runs.h: every axis
// alone and together, GPipe and 1F1B, ZeRO 1 and 2, checkpointing.
const std::vector<Layout>& full_layouts() {
  static const std::vector<Layout> layouts = {
      {2, 1, 1, 0, "1f1b", "none"},  {1, 2, 1, 0, "1f1b", "full"},
      {1, 1, 2, 0, "gpipe", "full"}, {4, 1, 1, 2, "1f1b", "full"},
      {1, 1, 4, 0, "1f1b", "none"},  {2, 2, 2, 1, "gpipe", "full"},
      {2, 2, 2, 2, "1f1b", "none"},  {1, 8, 1, 0, "gpipe", "none"},
      {2, 1, 4, 1, "1f1b", "full"},
  };
  return layouts;
}
const std::vector<Layout>& lora_layouts_subset() {
  static const std::vector<Layout> layouts = {
      {1, 2, 2, 0, "1f1b", "none", 2},
      {2, 2, 2, 1, "gpipe", "full", 4},
      {4, 2, 1, 2, "1f1b", "none", 0, "per_rank"},
  };
  return layouts;
}

class Validation : public ::testing::Test {
protected:
  // tokens.h5 (the GPL-3, make_run_dir's), and the Apache-2.0 licence as
  // held-out tokens: in both.h5's /val_tokens beside the GPL-3's /tokens,
  // and alone in val.h5 and its copy val_copy.h5.
  static void SetUpTestSuite() {
    dir_ = make_run_dir("meshlm_validation");
    if (world_rank() == 0) {
      const std::string val = (dir_ / "val.h5").string();
      io::tokenize_bytes("/usr/share/common-licenses/Apache-2.0", val);
      fs::copy_file(val, dir_ / "val_copy.h5");
      fs::copy_file(dir_ / "tokens.h5", dir_ / "both.h5");
      const io::TokenReader r = io::TokenReader::open(val);
      std::vector<int32_t> ids(r.size());
      r.read(0, ids.size(), ids.data());
      const std::string both = (dir_ / "both.h5").string();
      io::h5::File f = io::h5::open_file(both, true);
      io::h5::write_dataset_raw(f, io::kValTokensDataset, H5T_STD_U16LE, H5T_NATIVE_INT32,
                            ids.data(), {static_cast<hsize_t>(ids.size())});
      io::h5::close_file(f, both);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  static void TearDownTestSuite() { remove_run_dir(dir_); }
  static inline fs::path dir_;

  static std::string at(const char* name) { return (dir_ / name).string(); }

  static RunResult run(const char* config, std::vector<std::string> o, int ranks) {
    return train_on_first_ranks(config, std::move(o), ranks, dir_);
  }

  // Every layout against one rank: the held-out losses (at the same steps)
  // and the training losses within kTol, the memory as predicted.
  static void compare(const char* config, const std::vector<Layout>& layouts,
                      const std::vector<std::string>& extra) {
    ASSERT_EQ(world_size(), 8) << "run this test on 8 ranks";
    std::vector<std::string> base = {"--data.path=" + at("both.h5")};
    base.insert(base.end(), extra.begin(), extra.end());
    const RunResult ref = run(config, base, 1);
    for (const Layout& l : layouts) {
      std::vector<std::string> o = l.overrides();
      o.insert(o.end(), base.begin(), base.end());
      const RunResult r = run(config, o, l.ranks());
      if (world_rank() != 0) continue;
      SCOPED_TRACE(l.name());
      ASSERT_EQ(r.evals.size(), ref.evals.size());
      double worst = 0;
      for (size_t i = 0; i < ref.evals.size(); ++i) {
        EXPECT_EQ(r.evals[i].step, ref.evals[i].step);
        worst = std::max(worst, std::abs(r.evals[i].loss - ref.evals[i].loss) /
                                    std::abs(ref.evals[i].loss));
      }
      EXPECT_LE(worst, kTol);
      EXPECT_LE(worst_loss_rel(r.losses, ref.losses), kTol);
      expect_predicted_exactly(r);
      std::printf("  %-48s val_loss rel %.2e\n", l.name().c_str(), worst);
    }
    if (world_rank() == 0) {
      ASSERT_EQ(ref.evals.size(), 2u);  // after eval_every steps and at the last
      EXPECT_LT(ref.evals.back().loss, ref.evals.front().loss);  // the model learns
    }
  }

  // The same layout with and without evaluation: the same bits.
  static void expect_unchanged(const char* config, const Layout& l,
                               const std::vector<std::string>& extra) {
    std::vector<std::string> o = l.overrides();
    o.insert(o.end(), extra.begin(), extra.end());
    std::vector<std::string> off = o;
    off.push_back("--train.eval_every=0");
    o.push_back("--data.val_path=" + at("val.h5"));
    const RunResult with = run(config, o, l.ranks());
    const RunResult without = run(config, off, l.ranks());
    if (world_rank() != 0) return;
    SCOPED_TRACE(l.name());
    EXPECT_FALSE(with.evals.empty());
    EXPECT_TRUE(without.evals.empty());
    ASSERT_EQ(with.losses.size(), without.losses.size());
    ASSERT_EQ(with.params.size(), without.params.size());
    for (size_t i = 0; i < with.losses.size(); ++i)
      EXPECT_EQ(with.losses[i], without.losses[i]) << "step " << i + 1;  // bit for bit
    size_t differ = 0;
    for (size_t i = 0; i < with.params.size(); ++i) differ += with.params[i] != without.params[i];
    EXPECT_EQ(differ, 0u) << "of " << with.params.size() << " parameters";
  }
};

TEST_F(Validation, Gpt2FullTrainingSameValLossInEveryLayout) {
  compare(kGpt2, full_layouts(), {});
}

TEST_F(Validation, Gpt2LoraOnNf4BaseSameValLossInEveryLayout) {
  compare(kGpt2, lora_layouts_subset(), {"--finetune.mode=lora"});
}

TEST_F(Validation, LlamaSameValLossInEveryLayout) {
  compare(kLlama, {{2, 2, 2, 1, "gpipe", "full"}, {1, 8, 1, 0, "gpipe", "none"},
                   {2, 1, 4, 2, "1f1b", "none"}},
          {});
  compare(kLlama, {{2, 2, 2, 2, "1f1b", "full", 4}}, {"--finetune.mode=lora"});
}

TEST_F(Validation, TrainingIsUnchangedByEvaluationBitForBit) {
  expect_unchanged(kGpt2, {1, 1, 1, 0, "1f1b", "none"}, {});
  expect_unchanged(kGpt2, {2, 2, 2, 2, "1f1b", "full"}, {});
  expect_unchanged(kGpt2, {1, 2, 4, 1, "gpipe", "none"}, {"--finetune.mode=lora"});
  expect_unchanged(kLlama, {2, 2, 2, 1, "1f1b", "full"}, {});
}

// Training on the held-out tokens themselves, in file order, at lr 1e-30
// (the weights move by about 1e-30: nothing a float of a weight holds), for
// eval_batches steps: each step's batch is one evaluation batch, so the mean
// of those training losses is the held-out loss evaluated after step 1.
// val_copy.h5 is val.h5's copy: another file, the same windows.
TEST_F(Validation, ValLossIsTheMeanLossOfItsWindows) {
  for (const Layout& l : {Layout{1, 1, 1, 0, "1f1b", "none"}, Layout{2, 1, 2, 1, "gpipe", "none"},
                          Layout{1, 2, 2, 0, "1f1b", "full"}}) {
    for (const char* config : {kGpt2, kLlama}) {
      std::vector<std::string> o = l.overrides();
      o.insert(o.end(), {"--data.path=" + at("val.h5"), "--data.val_path=" + at("val_copy.h5"),
                         "--data.shuffle=false", "--train.lr=1e-30", "--train.steps=3",
                         "--train.eval_every=1", "--train.eval_batches=3"});
      const RunResult r = run(config, o, l.ranks());
      if (world_rank() != 0) continue;
      SCOPED_TRACE(l.name());
      ASSERT_EQ(r.losses.size(), 3u);
      ASSERT_EQ(r.evals.size(), 3u);
      const double mean = (r.losses[0] + r.losses[1] + r.losses[2]) / 3;
      EXPECT_EQ(r.evals[0].step, 1);
      EXPECT_NEAR(r.evals[0].loss, mean, 1e-6 * mean);
      // The same windows each time, the same weights: the same value.
      EXPECT_NEAR(r.evals[2].loss, r.evals[0].loss, 1e-6 * mean);
      std::printf("  %-48s val_loss %.7f  mean training loss %.7f\n", l.name().c_str(),
                  r.evals[0].loss, mean);
    }
  }
}

}  // namespace
