// debug::Faults (train/faults.h): the failures [debug] injects happen exactly
// where it says (rank, step, window of steps) and nowhere else, a default
// Faults injects nothing, and the records a test asks for are kept only then.
// The SIGKILL inside a save runs in a death test's child here, and in whole
// runs in tests/checkpoint/kill_and_resume.sh.
#include <gtest/gtest.h>

#include <csignal>
#include <string>

#include "core/error.h"
#include "train/faults.h"

using namespace meshlm;

TEST(Faults, ADefaultOneInjectsAndKeepsNothing) {
  const debug::Faults none;
  for (int step = 1; step <= 5; ++step) {
    EXPECT_NO_THROW(none.in_forward(step));
    EXPECT_FALSE(none.poisons_gradients(step));
    EXPECT_NO_THROW(none.in_checkpoint(step, "create"));
  }
  EXPECT_FALSE(none.keeps_records());
  // The default [debug] section as any rank applies it: the same.
  const debug::Faults defaults(DebugConfig{}, 0);
  EXPECT_NO_THROW(defaults.in_forward(1));
  EXPECT_FALSE(defaults.poisons_gradients(1));
  EXPECT_NO_THROW(defaults.in_checkpoint(1, "create"));
}

TEST(Faults, TheInjectedFailureHitsItsRankAndStepOnly) {
  const DebugConfig d{.fail_rank = 2, .fail_step = 3};
  const debug::Faults on_2(d, 2), on_1(d, 1);
  EXPECT_NO_THROW(on_2.in_forward(2));
  EXPECT_NO_THROW(on_2.in_forward(4));
  EXPECT_NO_THROW(on_1.in_forward(3));
  try {
    on_2.in_forward(3);
    FAIL() << "no failure at rank 2, step 3";
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("debug.fail_rank = 2 at step 3"), std::string::npos)
        << e.what();
  }
}

TEST(Faults, NaNGradientsInTheirWindowOnRankZero) {
  const debug::Faults rank0(DebugConfig{.nan_step = 4, .nan_count = 2}, 0);
  const debug::Faults rank1(DebugConfig{.nan_step = 4, .nan_count = 2}, 1);
  EXPECT_FALSE(rank0.poisons_gradients(3));
  EXPECT_TRUE(rank0.poisons_gradients(4));
  EXPECT_TRUE(rank0.poisons_gradients(5));
  EXPECT_FALSE(rank0.poisons_gradients(6));
  EXPECT_FALSE(rank1.poisons_gradients(4));
}

TEST(Faults, KillsAtItsPointStepAndRankOnly) {
  const DebugConfig d{.kill_in_checkpoint = "rename", .kill_step = 7, .kill_rank = 1};
  const debug::Faults rank1(d, 1), rank0(d, 0);
  EXPECT_NO_THROW(rank1.in_checkpoint(7, "create"));  // another point
  EXPECT_NO_THROW(rank1.in_checkpoint(6, "rename"));  // another step
  EXPECT_NO_THROW(rank0.in_checkpoint(7, "rename"));  // another rank
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP's threads may be up
  EXPECT_EXIT(rank1.in_checkpoint(7, "rename"), ::testing::KilledBySignal(SIGKILL), "");
}

TEST(Faults, RecordsKeptWhenATestAsks) {
  EXPECT_TRUE(debug::Faults(DebugConfig{}, 0, debug::Records::every_step).keeps_records());
  EXPECT_FALSE(debug::Faults(DebugConfig{}, 0, debug::Records::none).keeps_records());
}
