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


class LlamaLayouts : public ::testing::Test {
protected:
  static void SetUpTestSuite() { dir_ = make_run_dir("meshlm_llama_layouts"); }
  static void TearDownTestSuite() { remove_run_dir(dir_); }
  static inline std::filesystem::path dir_;

  // Trains every layout of `layouts` and compares it with one rank.
  static void compare(const std::vector<Layout>& layouts, const std::vector<std::string>& extra) {
    expect_layouts_match_one_rank(kLlamaLayoutsConfig, dir_, layouts, extra, {}, 0.05);
  }
};

TEST_F(LlamaLayouts, FullTrainingInEveryLayoutMatchesOneRank) {
  compare(parallel_layouts(), {});
}

TEST_F(LlamaLayouts, LoraOnANodeSharedNf4BaseInEveryLayoutMatchesOneRank) {
  compare(lora_layouts(), {"--finetune.mode=lora"});
}

}  // namespace
