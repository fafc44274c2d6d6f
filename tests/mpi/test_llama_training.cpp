// A Llama-family model (grouped-query attention, rotary embeddings with
// Llama 3's scaling, SwiGLU, an untied or tied classifier) trained under
// data, tensor and pipeline parallelism (tp 2 splits the two key/value
// heads, tp 4 replicates them), ZeRO 1 and 2 and activation checkpointing,
// against one rank: the losses within 1e-5 relative and the gathered final
// parameters within 1e-5 (norm-wise), every rank's memory equal to its
// prediction per category; LoRA on an NF4 base of it likewise. The full
// list of layouts: test_llama_layouts (left out of CI's sanitizer run,
// which runs these).
// meshlm-test-ranks: 4
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "training_runs.h"

using namespace meshlm;
using namespace meshlm::testing;

namespace {

const char* kConfig = R"(
[model]
arch = llama
n_layer = 4
n_head = 4
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
[train]
steps = 8
batch_size = 8
lr = 2e-3
warmup_steps = 2
seed = 5
)";

class LlamaTraining : public ::testing::Test {
protected:
  static void SetUpTestSuite() { dir_ = make_run_dir("meshlm_llama"); }
  static void TearDownTestSuite() { remove_run_dir(dir_); }
  static inline std::filesystem::path dir_;

  // The losses and memory of `layout` on `w` ranks against one rank's.
  void check(const std::vector<std::string>& common, const std::vector<std::string>& layout, int w) {
    std::vector<std::string> one = common, many = common;
    one.push_back("--train.micro_batch_size=2");
    many.insert(many.end(), layout.begin(), layout.end());
    const RunResult ref = train_on_first_ranks(kConfig, one, 1, dir_);
    const RunResult got = train_on_first_ranks(kConfig, many, w, dir_);
    if (world_rank() != 0) return;
    std::string name;
    for (const std::string& s : layout) name += s + " ";
    SCOPED_TRACE(name);
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    ASSERT_EQ(ref.losses.size(), 8u);
    for (size_t i = 0; i < ref.losses.size(); ++i)
      EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "step " << i + 1;
    EXPECT_LT(ref.losses.back(), ref.losses.front());  // it learns
    ASSERT_EQ(got.params.size(), ref.params.size());
    EXPECT_LT(norm_rel(got.params, ref.params), 1e-5);
    for (size_t q = 0; q < got.peaks.size(); ++q)
      for (int c = 0; c < kNumMemCategories; ++c)
        EXPECT_EQ(got.peaks[q][c], got.predicted[q][c])
            << "rank " << q << " category " << mem_category_name(static_cast<MemCategory>(c));
  }
};

TEST_F(LlamaTraining, EveryLayoutMatchesOneRank) {
  const std::vector<std::string> untied = {"--model.tie_word_embeddings=false"};
  check(untied, {"--parallel.dp=2", "--train.micro_batch_size=2"}, 2);
  check(untied, {"--parallel.pp=2", "--parallel.micro_batches=4"}, 2);
  check(untied, {"--parallel.dp=2", "--parallel.pp=2", "--parallel.zero_stage=1",
                 "--parallel.micro_batches=2", "--parallel.activation_checkpointing=full"}, 4);
  check(untied, {"--parallel.dp=4", "--parallel.zero_stage=2", "--train.micro_batch_size=1"}, 4);
  check(untied, {"--parallel.tp=2", "--parallel.pp=2", "--parallel.micro_batches=4"}, 4);
  // Tied: the embedding's gradient summed between the first and last stage.
  const std::vector<std::string> tied = {"--model.tie_word_embeddings=true"};
  check(tied, {"--parallel.pp=2", "--parallel.micro_batches=4", "--parallel.schedule=gpipe"}, 2);
  check(tied, {"--parallel.dp=2", "--parallel.pp=2", "--parallel.zero_stage=2",
               "--parallel.micro_batches=2"}, 4);
  // The tied classifier split over the vocabulary; key/value heads replicated.
  check(tied, {"--parallel.tp=4", "--train.micro_batch_size=2"}, 4);
}

TEST_F(LlamaTraining, LoraOnAnNf4BaseMatchesOneRank) {
  // Adapters on every projection of the attention and the MLP by default.
  check({"--finetune.mode=lora", "--finetune.lora_rank=4", "--quant.type=nf4"},
        {"--parallel.dp=2", "--parallel.pp=2", "--parallel.micro_batches=2"}, 4);
  check({"--finetune.mode=lora", "--finetune.lora_targets=q,v,down", "--quant.type=nf4"},
        {"--parallel.dp=2", "--train.micro_batch_size=2"}, 2);
  check({"--finetune.mode=lora", "--finetune.lora_rank=4", "--quant.type=nf4"},
        {"--parallel.dp=2", "--parallel.tp=2", "--train.micro_batch_size=2"}, 4);
}

}  // namespace
