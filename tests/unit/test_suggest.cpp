// core/suggest.h: the near name an error message offers for a mistyped one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/suggest.h"

using namespace meshlm;

namespace {
const std::vector<std::string> kNames = {"model.n_layer", "model.n_head", "model.n_embd",
                                         "train.steps", "--max-new-tokens", "--top-k", "--top-p"};
}

TEST(Suggest, NamesWithinTwoEditsCaseAside) {
  EXPECT_EQ(nearest_name("model.n_layers", kNames), "model.n_layer");   // one insertion
  EXPECT_EQ(nearest_name("model.n_embed", kNames), "model.n_embd");     // one insertion
  EXPECT_EQ(nearest_name("modle.n_layer", kNames), "model.n_layer");    // two substitutions
  EXPECT_EQ(nearest_name("train.stp", kNames), "train.steps");          // two deletions
  EXPECT_EQ(nearest_name("MODEL.N_HEAD", kNames), "model.n_head");      // case
  EXPECT_EQ(nearest_name("--max-new-token", kNames), "--max-new-tokens");
  EXPECT_EQ(did_you_mean("train.step", kNames), "; did you mean 'train.steps'?");
}

TEST(Suggest, NothingBeyondTwoEdits) {
  EXPECT_EQ(nearest_name("model.layers", kNames), "");     // three edits from model.n_layer
  EXPECT_EQ(nearest_name("frobnicate", kNames), "");
  EXPECT_EQ(nearest_name("", kNames), "");
  EXPECT_EQ(nearest_name("model.n_layer", {}), "");
  EXPECT_EQ(nearest_name(std::string(101, 'x'), {std::string(101, 'x')}), "");  // too long to try
  EXPECT_EQ(did_you_mean("frobnicate", kNames), "");
}

TEST(Suggest, TheNearestWinsAndTheFirstOfEquals) {
  // --top-q is one edit from --top-k and from --top-p: the first listed.
  EXPECT_EQ(nearest_name("--top-q", kNames), "--top-k");
  // One edit beats two, wherever it is listed.
  EXPECT_EQ(nearest_name("model.n_hed", {"model.n_embd", "model.n_head"}), "model.n_head");
}
