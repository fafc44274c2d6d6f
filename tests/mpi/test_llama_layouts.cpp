// A Llama-family model under the 25 layouts of GPT-2's full training and the
// LoRA layouts on a node-shared NF4 base (tests/mpi/training_runs.h), against
// one rank: the losses within 1e-5 relative, the gathered final parameters
// (or adapters) within 1e-5 norm-wise, every rank's memory equal to its
// prediction per category. Two key/value heads for eight query heads: tp 2
// splits them, tp 4 and 8 replicate them (their gradients summed over the
// group).
// meshlm-test-ranks: 8
#include <gtest/gtest.h>

#include <cstdio>
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

class LlamaLayouts : public ::testing::Test {
protected:
  static void SetUpTestSuite() { dir_ = make_run_dir("meshlm_llama_layouts"); }
  static void TearDownTestSuite() { remove_run_dir(dir_); }
  static inline std::filesystem::path dir_;

  // Trains every layout of `layouts` and compares it with one rank.
  static void compare(const std::vector<Layout>& layouts, const std::vector<std::string>& extra) {
    ASSERT_EQ(world_size(), 8) << "run this test on 8 ranks";
    const RunResult ref = train_on_first_ranks(kConfig, extra, 1, dir_);
    for (const Layout& l : layouts) {
      std::vector<std::string> o = l.overrides();
      o.insert(o.end(), extra.begin(), extra.end());
      const RunResult r = train_on_first_ranks(kConfig, o, l.ranks(), dir_);
      if (world_rank() != 0) continue;
      SCOPED_TRACE(l.name());
      ASSERT_EQ(r.losses.size(), ref.losses.size());
      const double worst = worst_loss_rel(r.losses, ref.losses);
      EXPECT_LE(worst, 1e-5);
      ASSERT_EQ(r.params.size(), ref.params.size());
      const double prel = norm_rel(r.params, ref.params);
      EXPECT_LE(prel, 1e-5);
      expect_predicted_exactly(r);
      std::printf("  %-48s loss rel %.2e  params rel %.2e\n", l.name().c_str(), worst, prel);
    }
    if (world_rank() == 0) EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05);  // it learns
  }
};

TEST_F(LlamaLayouts, FullTrainingInEveryLayoutMatchesOneRank) {
  compare(parallel_layouts(), {});
}

TEST_F(LlamaLayouts, LoraOnANodeSharedNf4BaseInEveryLayoutMatchesOneRank) {
  compare(lora_layouts(), {"--finetune.mode=lora"});
}

}  // namespace
