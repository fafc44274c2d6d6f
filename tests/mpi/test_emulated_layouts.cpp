// The layouts of many ranks on a device backend, without a GPU: the jobs of
// test_parallel_training, test_lora_training and test_llama_layouts under
// runtime.backend = emulated (train/emulated_device.h: the CPU's kernels on
// device memory the host cannot touch between ops), so every buffer the
// engine exchanges is a device buffer and every group moves it by host
// staging (comm.device = auto resolves to host), or under comm.device = nccl
// (its emulation, comm/ordered_comm.h): GPT-2 both ways, LoRA through the
// host, Llama in NCCL's order. Each layout
// against one rank of the CPU backend: the losses within 1e-5 relative, the
// gathered final parameters (or adapters) within 1e-5 norm-wise, every
// rank's memory (host and device together) its prediction per category.
// A host access to a device buffer, or one handed to MPI, would stop the
// rank with SIGSEGV.
// meshlm-test-ranks: 8
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "mpi/training_runs.h"

using namespace meshlm;
using namespace meshlm::testing;

namespace {

const std::vector<std::string> kEmulated = {"--runtime.backend=emulated"};

class EmulatedLayouts : public ::testing::Test {
protected:
  static void SetUpTestSuite() { dir_ = make_run_dir("meshlm_emulated_layouts"); }
  static void TearDownTestSuite() { remove_run_dir(dir_); }
  static inline std::filesystem::path dir_;
};

TEST_F(EmulatedLayouts, FullTrainingInEveryLayoutMatchesOneCpuRank) {
  expect_layouts_match_one_rank(kGpt2LayoutsConfig, dir_, parallel_layouts(), {}, kEmulated, 0.1);
}

// comm.device = nccl: every group's device buffers (the pipeline's over its
// links, comm/pipeline_links.h) on the emulation of NCCL's stream order
// (comm/ordered_comm.h), with the DP reduction overlapped with the backward
// (comm.overlap = auto): an engine that issued collectives in different
// orders on two ranks, or a receive behind a send, would hang or mix them.
TEST_F(EmulatedLayouts, FullTrainingInEveryLayoutMatchesOneCpuRankInNcclOrder) {
  std::vector<std::string> nccl = kEmulated;
  nccl.push_back("--comm.device=nccl");
  expect_layouts_match_one_rank(kGpt2LayoutsConfig, dir_, parallel_layouts(), {}, nccl, 0.1);
}

// The base reaches the node leaders through their "GPUs" (quant.broadcast =
// nccl; the device chunk is in the prediction of base loading).
TEST_F(EmulatedLayouts, LoraOnANodeSharedBaseInEveryLayoutMatchesOneCpuRank) {
  std::vector<std::string> o = kEmulated;
  o.push_back("--quant.broadcast=nccl");
  expect_layouts_match_one_rank(kLoraLayoutsConfig, dir_, lora_layouts(), {}, o, 0.05);
}

// Llama's layouts (grouped-query attention: key/value heads replicated
// over tp where fewer, their gradients reduced) in NCCL's order only: its
// host staging is GPT-2's.
TEST_F(EmulatedLayouts, LlamaInEveryLayoutMatchesOneCpuRankInNcclOrder) {
  std::vector<std::string> nccl = kEmulated;
  nccl.push_back("--comm.device=nccl");
  expect_layouts_match_one_rank(kLlamaLayoutsConfig, dir_, parallel_layouts(), {}, nccl, 0.05);
}

}  // namespace
