// The layouts of many ranks on a device backend, without a GPU: the jobs of
// test_parallel_training, test_lora_training and test_llama_layouts under
// runtime.backend = emulated (train/emulated_device.h: the CPU's kernels on
// device memory the host cannot touch between ops), so every buffer the
// engine exchanges is a device buffer and every group moves it by host
// staging (comm.device = host), under comm.device = nccl (its emulation,
// comm/ordered_comm.h), or under auto with ranks sharing GPUs (each group
// its own path): GPT-2 all three ways, LoRA through the host, Llama's
// tensor-parallel layouts in NCCL's order. Each layout
// against one rank of the CPU backend: the losses within 1e-5 relative, the
// gathered final parameters (or adapters) within 1e-5 norm-wise, every
// rank's memory (host and device together) its prediction per category.
// A host access to a device buffer, or one handed to MPI, would stop the
// rank with SIGSEGV.
//
// With MESHLM_LAYOUTS_BACKEND=cuda (ctest's cuda_layouts_one_gpu), the same
// program runs the layouts on a real GPU that all 8 ranks share, so every
// group stages through the host (comm.device = host: NCCL refuses two ranks
// on one device): GPT-2's 25 layouts in fp32 (1e-5 of one CPU rank) and in
// bf16 (those of 4 and 8 ranks, against one CPU rank in bf16, within the
// bf16 tolerance), LoRA's layouts and Llama's tensor-parallel ones. What
// needs a GPU per rank (NCCL's order, auto) skips, saying why; all of it
// skips where no GPU can be used.
// meshlm-test-ranks: 8
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "mpi/training_runs.h"
#include "train/backend.h"

using namespace meshlm;
using namespace meshlm::testing;

namespace {

// MESHLM_LAYOUTS_BACKEND=cuda: the layouts on a real GPU (see the top).
bool on_gpu() {
  const char* b = std::getenv("MESHLM_LAYOUTS_BACKEND");
  return b != nullptr && std::string(b) == "cuda";
}

class EmulatedLayouts : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    dir_ = make_run_dir("meshlm_emulated_layouts");
    if (!on_gpu()) return;
    // Collective: a rank that can use no GPU makes every rank throw.
    try {
      const ProcessMesh mesh(MPI_COMM_WORLD, MeshLayout(world_size(), 1, 1), 0);
      const Backend probe(ComputeBackend::cuda, mesh);
    } catch (const std::exception& e) {
      no_gpu_ = e.what();
    }
  }
  static void TearDownTestSuite() { remove_run_dir(dir_); }
  void SetUp() override {
    if (!no_gpu_.empty()) GTEST_SKIP() << no_gpu_;
  }
  // The device's flags: the emulated device, or the shared GPU's.
  static std::vector<std::string> device() {
    if (on_gpu()) return {"--runtime.backend=cuda"};
    return {"--runtime.backend=emulated"};
  }
  static inline std::filesystem::path dir_;
  static inline std::string no_gpu_;
};

const char* const kGpuPerRank =
    "each rank needs a GPU of its own (NCCL refuses two ranks on one device); "
    "run on 8 GPUs, or on the emulated device without MESHLM_LAYOUTS_BACKEND";

// comm.device = host: every group's device buffers staged through the
// host (comm/staged_comm.h), as ranks that share a GPU move them.
TEST_F(EmulatedLayouts, FullTrainingInEveryLayoutMatchesOneCpuRank) {
  std::vector<std::string> host = device();
  host.push_back("--comm.device=host");
  expect_layouts_match_one_rank(kGpt2LayoutsConfig, dir_, parallel_layouts(), {}, host, 0.1);
}

// On the GPU in bf16 (its bf16 GEMMs and kernels), the layouts of 4 and 8
// ranks against one CPU rank in bf16 (the CPU's GEMM inputs rounded to
// bf16): within the bf16 tolerance of tests/cuda/train_cuda.sh, 1.5%, for
// the losses and the final parameters norm-wise. The emulated device runs
// the CPU's kernels, which test_parallel_training covers in bf16.
TEST_F(EmulatedLayouts, Bf16OnTheGpuInEveryLayoutMatchesOneCpuRank) {
  if (!on_gpu()) GTEST_SKIP() << "the GPU's bf16 kernels: MESHLM_LAYOUTS_BACKEND=cuda";
  std::vector<Layout> layouts;
  for (const Layout& l : parallel_layouts())
    if (l.ranks() >= 4) layouts.push_back(l);
  std::vector<std::string> host = device();
  host.push_back("--comm.device=host");
  expect_layouts_match_one_rank(kGpt2LayoutsConfig, dir_, layouts, {"--train.precision=bf16"},
                                host, 0.1, 1.5e-2);
}

// comm.device = nccl: every group's device buffers (the pipeline's over its
// links, comm/pipeline_links.h) on the emulation of NCCL's stream order
// (comm/ordered_comm.h), with the DP reduction overlapped with the backward
// (comm.overlap = auto): an engine that issued collectives in different
// orders on two ranks, or a receive behind a send, would hang or mix them.
// The layouts of 4 and 8 ranks (those of 2 are each one axis, which the 4-
// and 8-rank layouts hold too).
TEST_F(EmulatedLayouts, FullTrainingInEveryLayoutMatchesOneCpuRankInNcclOrder) {
  if (on_gpu()) GTEST_SKIP() << kGpuPerRank;
  std::vector<std::string> nccl = device();
  nccl.push_back("--comm.device=nccl");
  std::vector<Layout> layouts;
  for (const Layout& l : parallel_layouts())
    if (l.ranks() >= 4) layouts.push_back(l);
  expect_layouts_match_one_rank(kGpt2LayoutsConfig, dir_, layouts, {}, nccl, 0.1);
}

// comm.device = auto on nodes whose ranks share GPUs (cluster.gpus_per_node
// of the emulated device): each group takes its own path, NCCL where its
// ranks have a GPU each and the host where two share one, so that one rank
// holds NCCL's and staged communicators side by side, and its memory
// prediction stages only the groups that do (train/group_paths.h). On one
// node of 2 GPUs (rank r on GPU r mod 2): tp {0, 1} NCCL's, dp {0, 2} and pp
// {0, 2} staged; dp {0, 1} NCCL's beside pp {0, 2}. On 4 GPUs: dp {0, 2} and
// tp NCCL's (the DP reduction overlapped: comm.overlap = auto), pp {0, 4}
// staged; dp {0, 2, 4, 6} staged beside tp; pp {0, 2, 4, 6} staged beside
// dp {0, 1}; and two nodes of 4: all NCCL's.
TEST_F(EmulatedLayouts, AutoTakesEachGroupsOwnPathWhereRanksShareGpus) {
  if (on_gpu()) GTEST_SKIP() << kGpuPerRank;
  std::vector<std::string> two = device(), four = device();
  two.push_back("--cluster.gpus_per_node=2");
  four.push_back("--cluster.gpus_per_node=4");
  const std::vector<Layout> on_two = {
      {2, 2, 1, 2, "1f1b", "none"},
      {1, 2, 2, 0, "1f1b", "full"},
      {2, 1, 2, 1, "gpipe", "none"},
      {2, 2, 2, 1, "1f1b", "none"},
  };
  const std::vector<Layout> on_four = {
      {2, 2, 2, 0, "1f1b", "none"},
      {4, 2, 1, 1, "1f1b", "none"},
      {2, 1, 4, 1, "1f1b", "full"},
      {2, 2, 2, 2, "1f1b", "full", 4},
  };
  expect_layouts_match_one_rank(kGpt2LayoutsConfig, dir_, on_two, {}, two, 0.1);
  expect_layouts_match_one_rank(kGpt2LayoutsConfig, dir_, on_four, {}, four, 0.1);
}

// The base reaches the node leaders through their "GPUs" (quant.broadcast =
// nccl; the device chunk is in the prediction of base loading); the groups
// through the host (comm.device = host).
// On the shared GPU the base reaches the leaders by MPI (quant.broadcast =
// nccl would put two leaders on one device).
TEST_F(EmulatedLayouts, LoraOnANodeSharedBaseInEveryLayoutMatchesOneCpuRank) {
  std::vector<std::string> o = device();
  if (!on_gpu()) o.push_back("--quant.broadcast=nccl");
  o.push_back("--comm.device=host");
  expect_layouts_match_one_rank(kLoraLayoutsConfig, dir_, lora_layouts(), {}, o, 0.05);
}

// Llama's layouts with tensor parallelism (grouped-query attention:
// key/value heads split over tp 2, replicated over tp 4 and 8, their
// gradients then reduced over the group) in NCCL's order: the 12 of the 25
// where its communication is not GPT-2's (without tp it is GPT-2's, less
// the tied embedding's; test_llama_layouts runs all 25 on the CPU).
// On the shared GPU, the same layouts through the host.
TEST_F(EmulatedLayouts, LlamaUnderTensorParallelismMatchesOneCpuRankInNcclOrder) {
  std::vector<std::string> nccl = device();
  nccl.push_back(on_gpu() ? "--comm.device=host" : "--comm.device=nccl");
  std::vector<Layout> tp;
  for (const Layout& l : parallel_layouts())
    if (l.tp > 1) tp.push_back(l);
  ASSERT_EQ(tp.size(), 12u);
  expect_layouts_match_one_rank(kLlamaLayoutsConfig, dir_, tp, {}, nccl, 0.05);
}

}  // namespace
