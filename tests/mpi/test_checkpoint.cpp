// Checkpoints written by training and read back under other layouts:
//  * the datasets hold the logical tensors: the whole model's gathered
//    parameters, bit for bit, whatever layout wrote them;
//  * exact resume: a run resumed from the checkpoint an uninterrupted run
//    wrote at step N gives that run's losses and parameters bit for bit
//    (same layout; shuffled data, gradient accumulation, ZeRO);
//  * resharding: a checkpoint of (dp, tp, pp) = (2, 2, 2) resumes under
//    (1,1,1), (4,2,1), (1,2,4), (2,1,2) with ZeRO 0, 1 and 2 on either side,
//    with the uninterrupted run's losses within 1e-5;
//  * LoRA: the same for adapters on a frozen base; finetune.adapters_from
//    starts a new fine-tune from saved adapters;
//  * checkpoint.async writes the same files as a synchronous save, from a
//    snapshot the memory model predicts.
// meshlm-test-ranks: 8
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint_file.h"
#include "io/h5.h"
#include "model/gpt.h"
#include "mpi/training_runs.h"

using namespace meshlm;
using namespace meshlm::testing;
namespace fs = std::filesystem;

namespace {

// NH = 4 and Vp = 256 split by tp = 2 and 4; 4 layers over pp = 4.
const char* kFull = R"(
[model]
n_layer = 4
n_head = 4
n_embd = 32
vocab_size = 256
seq_len = 16
max_seq_len = 16
[train]
steps = 8
batch_size = 8
micro_batch_size = 1
lr = 3e-3
warmup_steps = 2
seed = 5
log_every = 100
[data]
shuffle = true
)";

const char* kLora = R"(
[model]
n_layer = 4
n_head = 4
n_embd = 32
vocab_size = 256
seq_len = 16
max_seq_len = 16
[train]
steps = 8
batch_size = 8
micro_batch_size = 1
lr = 1e-2
warmup_steps = 2
seed = 9
log_every = 100
[finetune]
mode = lora
lora_rank = 4
lora_alpha = 8
[quant]
type = nf4
[data]
shuffle = true
)";

struct Layout {
  int dp, tp, pp, zero;
  int ranks() const { return dp * tp * pp; }
  std::vector<std::string> args() const {
    return {"--parallel.dp=" + std::to_string(dp), "--parallel.tp=" + std::to_string(tp),
            "--parallel.pp=" + std::to_string(pp), "--parallel.zero_stage=" + std::to_string(zero)};
  }
  std::string name() const {
    return "(" + std::to_string(dp) + "," + std::to_string(tp) + "," + std::to_string(pp) +
           ") ZeRO " + std::to_string(zero);
  }
};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The losses of steps [from, to) of a run (1-based steps from + 1 ...).
std::vector<double> steps_of(const RunResult& r, size_t from) {
  return std::vector<double>(r.losses.begin() + static_cast<long>(from), r.losses.end());
}

// Rank 0: the trained tensors of a checkpoint in the order of the whole
// model's table, read with the serial HDF5 reader.
std::vector<float> read_checkpoint(const fs::path& file, const std::vector<ParamSpec>& table,
                                   bool lora) {
  std::vector<float> out;
  io::h5::File f = io::h5::open_file(file.string());
  for (const ParamSpec& p : table) {
    const std::vector<float> t = io::h5::read_dataset<float>(
        f, lora ? io::ckpt::lora_path(p.name) : io::ckpt::params_path(p.name));
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

class CheckpointTest : public ::testing::Test {
protected:
  void SetUp() override { dir_ = make_run_dir("meshlm_ckpt"); }
  void TearDown() override { remove_run_dir(dir_); }
  fs::path dir_;
};

TEST_F(CheckpointTest, FullTrainingResumesExactlyAndReshardsWithinTolerance) {
  const Layout writer{2, 2, 2, 1};
  const std::string ck = (dir_ / "ck222").string();
  // Uninterrupted: 8 steps, a checkpoint at step 4 (and the final one);
  // two micro-batches per step (accumulation) at dp 2.
  const RunResult full = train_on_first_ranks(
      kFull,
      with(writer.args(), {"--checkpoint.every=4", "--checkpoint.final=true",
                           "--checkpoint.keep_last=0", "--checkpoint.dir=" + ck}),
      writer.ranks(), dir_);
  const fs::path mid = fs::path(ck) / io::ckpt::file_name_of_step(4);
  if (world_rank() == 0) {
    ASSERT_EQ(full.losses.size(), 8u);
    ASSERT_TRUE(fs::exists(mid));
    // The final checkpoint holds the gathered parameters, bit for bit.
    const std::vector<float> saved = read_checkpoint(
        fs::path(ck) / io::ckpt::file_name_of_step(8), gpt_param_table(GPTConfig{4, 4, 32, 256, 16}), false);
    ASSERT_EQ(saved.size(), full.params.size());
    EXPECT_EQ(saved, full.params) << "the checkpoint is not the model's gathered parameters";
  }
  // Exact resume in the same layout.
  const RunResult same = train_on_first_ranks(
      kFull, with(writer.args(), {"--checkpoint.resume=" + mid.string()}), writer.ranks(), dir_);
  if (world_rank() == 0) {
    ASSERT_EQ(same.losses.size(), 4u);
    EXPECT_EQ(same.losses, steps_of(full, 4)) << "resume in the same layout is not exact";
    EXPECT_EQ(same.params, full.params);
  }
  // Other layouts, ZeRO stages on either side.
  for (const Layout& l : {Layout{1, 1, 1, 0}, Layout{4, 2, 1, 2}, Layout{1, 2, 4, 1},
                          Layout{2, 1, 2, 2}, Layout{2, 2, 2, 0}}) {
    const RunResult r = train_on_first_ranks(
        kFull, with(l.args(), {"--checkpoint.resume=" + mid.string()}), l.ranks(), dir_);
    if (world_rank() != 0) continue;
    ASSERT_EQ(r.losses.size(), 4u) << l.name();
    EXPECT_LT(worst_loss_rel(r.losses, steps_of(full, 4)), 1e-5) << l.name();
    EXPECT_LT(norm_rel(r.params, full.params), 1e-4) << l.name();
  }
  // A checkpoint of ZeRO 2 at (4, 2, 1) into (2, 2, 2) ZeRO 0.
  const std::string ck2 = (dir_ / "ck421").string();
  const Layout w2{4, 2, 1, 2};
  const RunResult full2 = train_on_first_ranks(
      kFull, with(w2.args(), {"--checkpoint.every=4", "--checkpoint.dir=" + ck2}), w2.ranks(), dir_);
  const RunResult back = train_on_first_ranks(
      kFull,
      with(Layout{2, 2, 2, 0}.args(),
           {"--checkpoint.resume=" + (fs::path(ck2) / io::ckpt::file_name_of_step(4)).string()}),
      8, dir_);
  if (world_rank() == 0) EXPECT_LT(worst_loss_rel(back.losses, steps_of(full2, 4)), 1e-5);
}

TEST_F(CheckpointTest, LoraAdaptersResumeAndStartANewFineTune) {
  const Layout writer{2, 2, 2, 2};
  const std::string ck = (dir_ / "lora").string();
  const RunResult full = train_on_first_ranks(
      kLora,
      with(writer.args(), {"--checkpoint.every=4", "--checkpoint.final=true",
                           "--checkpoint.keep_last=0", "--checkpoint.dir=" + ck}),
      writer.ranks(), dir_);
  const fs::path mid = fs::path(ck) / io::ckpt::file_name_of_step(4);
  const fs::path last = fs::path(ck) / io::ckpt::file_name_of_step(8);
  if (world_rank() == 0) {
    GPTOptions opts;
    opts.lora.enabled = true;
    opts.lora.rank = 4;
    opts.lora.alpha = 8;
    const std::vector<float> saved =
        read_checkpoint(last, trainable_table(GPTConfig{4, 4, 32, 256, 16}, {}, opts), true);
    EXPECT_EQ(saved, full.params) << "the checkpoint is not the gathered adapters";
  }
  const RunResult same = train_on_first_ranks(
      kLora, with(writer.args(), {"--checkpoint.resume=" + mid.string()}), writer.ranks(), dir_);
  if (world_rank() == 0) {
    EXPECT_EQ(same.losses, steps_of(full, 4)) << "LoRA resume in the same layout is not exact";
    EXPECT_EQ(same.params, full.params);
  }
  for (const Layout& l : {Layout{1, 1, 1, 0}, Layout{1, 2, 4, 1}}) {
    const RunResult r = train_on_first_ranks(
        kLora, with(l.args(), {"--checkpoint.resume=" + mid.string()}), l.ranks(), dir_);
    if (world_rank() == 0) EXPECT_LT(worst_loss_rel(r.losses, steps_of(full, 4)), 1e-5) << l.name();
  }
  // A new fine-tune from the final adapters: one step at a learning rate
  // too small to move them leaves them as saved; a fresh one (B = 0) has
  // the base's loss, the loaded adapters another.
  const std::vector<std::string> tiny_step = {"--train.steps=1", "--train.lr=1e-9",
                                              "--train.warmup_steps=0"};
  const RunResult fresh = train_on_first_ranks(kLora, tiny_step, 1, dir_);
  const RunResult from = train_on_first_ranks(
      kLora, with(tiny_step, {"--finetune.adapters_from=" + last.string()}), 1, dir_);
  if (world_rank() == 0) {
    ASSERT_EQ(from.params.size(), full.params.size());
    EXPECT_LT(max_rel(from.params, full.params), 1e-6);
    EXPECT_NE(from.losses.at(0), fresh.losses.at(0));
  }
}

// Rank 0: every dataset of two checkpoint files is the same, bit for bit,
// and so are the attributes of /meta that say where training stands.
void expect_same_checkpoint(const fs::path& a, const fs::path& b) {
  SCOPED_TRACE(a.string() + " vs " + b.string());
  io::h5::File fa = io::h5::open_file(a.string()), fb = io::h5::open_file(b.string());
  const std::vector<std::string> names = io::ckpt::list_datasets(fa);
  ASSERT_EQ(names, io::ckpt::list_datasets(fb));
  size_t tensors = 0;
  for (const std::string& n : names) {
    if (n.rfind("meta/", 0) == 0) continue;
    ++tensors;
    EXPECT_EQ(io::h5::read_dataset<float>(fa, n), io::h5::read_dataset<float>(fb, n)) << n;
    io::h5::Dataset da = io::h5::open_dataset(fa, n), db = io::h5::open_dataset(fb, n);
    EXPECT_EQ(io::h5::read_scalar_attr<uint64_t>(da, io::ckpt::kChecksumAttr),
              io::h5::read_scalar_attr<uint64_t>(db, io::ckpt::kChecksumAttr))
        << n;
  }
  EXPECT_GT(tensors, 0u);
  io::h5::Group ma(H5Gopen2(fa, "meta", H5P_DEFAULT)), mb(H5Gopen2(fb, "meta", H5P_DEFAULT));
  for (const char* k : {"step", "tokens_seen", "adamw_step", "loss_scale_good_steps"})
    EXPECT_EQ(io::h5::read_scalar_attr<int64_t>(ma, k), io::h5::read_scalar_attr<int64_t>(mb, k)) << k;
  for (const char* k : {"data_epoch", "data_position"})
    EXPECT_EQ(io::h5::read_scalar_attr<uint64_t>(ma, k), io::h5::read_scalar_attr<uint64_t>(mb, k)) << k;
}

// checkpoint.async: the background writer's files are the synchronous
// writer's (training goes on while it writes from the snapshot, so a
// snapshot taken late, or a write reading the live buffers, would differ),
// training is the same, and the snapshot is what the memory model books.
TEST_F(CheckpointTest, AsynchronousWritesGiveTheSynchronousFilesAndBookTheirSnapshot) {
  struct Case {
    const char* cfg;
    Layout layout;
  };
  for (const Case& k : {Case{kFull, {2, 2, 2, 2}}, Case{kFull, {4, 1, 2, 0}},
                        Case{kLora, {2, 1, 2, 1}}}) {
    SCOPED_TRACE(k.layout.name() + (k.cfg == kLora ? " LoRA" : ""));
    auto run = [&](const std::string& sub, bool async) {
      return train_on_first_ranks(
          k.cfg,
          with(k.layout.args(), {"--checkpoint.every=3", "--checkpoint.final=true",
                                 "--checkpoint.keep_last=0",
                                 "--checkpoint.dir=" + (dir_ / sub).string(),
                                 std::string("--checkpoint.async=") + (async ? "true" : "false")}),
          k.layout.ranks(), dir_);
    };
    const RunResult sync = run("sync", false);
    const RunResult async = run("async", true);
    if (world_rank() == 0) {
      EXPECT_EQ(async.losses, sync.losses) << "writing in the background changed training";
      EXPECT_EQ(async.params, sync.params);
      for (int step : {3, 6, 8})
        expect_same_checkpoint(dir_ / "sync" / io::ckpt::file_name_of_step(step),
                               dir_ / "async" / io::ckpt::file_name_of_step(step));
      ASSERT_EQ(async.peaks.size(), static_cast<size_t>(k.layout.ranks()));
      for (size_t r = 0; r < async.peaks.size(); ++r) {
        const size_t predicted = at(async.predicted[r], MemCategory::checkpoint);
        EXPECT_GT(predicted, 0u) << "rank " << r;
        EXPECT_EQ(at(async.peaks[r], MemCategory::checkpoint), predicted) << "rank " << r;
        EXPECT_EQ(at(sync.predicted[r], MemCategory::checkpoint), 0u) << "rank " << r;
        EXPECT_EQ(at(sync.peaks[r], MemCategory::checkpoint), 0u) << "rank " << r;
      }
    }
    if (world_rank() == 0) {
      fs::remove_all(dir_ / "sync");
      fs::remove_all(dir_ / "async");
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
