// LoRA fine-tuning on a frozen quantized base over the process mesh:
//  * the base is quantized once and every rank of a node sees the same bytes
//    through the node's shared window (same checksum on every rank, equal
//    to a private quantization), with one holder per node, also when
//    parallel.ranks_per_node makes one machine act as several nodes;
//  * LoRA training under many dp x tp x pp layouts gives the single-rank
//    losses within 1e-5 and the same adapters;
//  * every rank's memory is the prediction, category by category; the base
//    has no gradients and no optimizer state; only holders keep the bytes.
// meshlm-test-ranks: 8
#include <gtest/gtest.h>
#include <mpi.h>
#include <xxhash.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "app/parameter_file.h"
#include "core/alloc.h"
#include "load/base_source.h"
#include "mesh/mesh.h"
#include "model/gpt.h"
#include "mpi/training_runs.h"
#include "load/base_loader.h"
#include "train/trainer.h"

using namespace meshlm;
using namespace meshlm::testing;
namespace fs = std::filesystem;

namespace {


class LoraTraining : public ::testing::Test {
protected:
  static void SetUpTestSuite() { dir_ = make_run_dir("meshlm_lora"); }
  static void TearDownTestSuite() { remove_run_dir(dir_); }

  static RunConfig config(const Layout& l, int w, std::vector<std::string> extra = {}) {
    // Polling waits, as tests/mpi/training_runs.h says why.
    std::vector<std::string> o = {"--data.path=" + (dir_ / "tokens.h5").string(),
                                  "--comm.wait=poll"};
    for (auto& v : l.overrides()) o.push_back(v);
    o.insert(o.end(), extra.begin(), extra.end());
    return parse_run_config(kLoraLayoutsConfig, "test", o, w);
  }

  // Collective over the world: trains `l` on the first dp*tp*pp ranks.
  static RunResult train(const Layout& l, std::vector<std::string> extra = {}) {
    std::vector<std::string> o = l.overrides();
    o.insert(o.end(), extra.begin(), extra.end());
    return train_on_first_ranks(kLoraLayoutsConfig, o, l.ranks(), dir_);
  }

  static const RunResult& reference() {
    static const RunResult ref = train({1, 1, 1, 0, "1f1b", "none"});
    return ref;
  }

  static fs::path dir_;
};
fs::path LoraTraining::dir_;

constexpr double kLossTol = 1e-5;
constexpr double kAdapterTol = 1e-5;


// XXH3-64 of the bytes a rank sees.
uint64_t view_checksum(const load::FrozenBase& b) {
  return XXH3_64bits(b.store().data(), b.store().bytes());
}

}  // namespace

TEST_F(LoraTraining, EveryLayoutMatchesOneRank) {
  ASSERT_EQ(world_size(), 8) << "run this test on 8 ranks";
  const RunResult& ref = reference();
  for (const Layout& l : lora_layouts()) {
    const RunResult r = train(l);
    if (world_rank() != 0) continue;
    SCOPED_TRACE(l.name());
    ASSERT_EQ(r.losses.size(), ref.losses.size());
    const double worst = worst_loss_rel(r.losses, ref.losses);
    EXPECT_LE(worst, kLossTol);
    ASSERT_EQ(r.params.size(), ref.params.size());
    const double arel = norm_rel(r.params, ref.params);
    EXPECT_LE(arel, kAdapterTol);
    std::printf("  %-52s loss rel %.2e  adapters rel %.2e\n", l.name().c_str(), worst, arel);
  }
  if (world_rank() == 0) EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.1);
}

TEST_F(LoraTraining, Int8BaseAcrossLayouts) {
  const std::vector<std::string> int8 = {"--quant.type=int8"};
  const RunResult one = train({1, 1, 1, 0, "1f1b", "none"}, int8);
  const RunResult many = train({2, 2, 2, 0, "1f1b", "none", 4}, int8);
  if (world_rank() != 0) return;
  for (size_t i = 0; i < one.losses.size(); ++i)
    EXPECT_NEAR(many.losses[i], one.losses[i], kLossTol * one.losses[i]);
  EXPECT_LE(norm_rel(many.params, one.params), kAdapterTol);
  // A different base format is a different model.
  EXPECT_NE(one.losses.back(), reference().losses.back());
}

TEST_F(LoraTraining, MemoryPerRankIsPredictedExactly) {
  for (const Layout& l : {Layout{2, 2, 2, 0, "1f1b", "none"}, Layout{2, 2, 2, 2, "gpipe", "full", 4},
                          Layout{4, 1, 2, 1, "1f1b", "none", 2, "per_rank"}}) {
    const RunResult r = train(l);
    if (world_rank() != 0) continue;
    SCOPED_TRACE(l.name());
    size_t holders = 0;
    for (size_t q = 0; q < r.peaks.size(); ++q) {
      for (int c = 0; c < kNumMemCategories; ++c)
        EXPECT_EQ(r.peaks[q][c], r.predicted[q][c])
            << "rank " << q << " category " << mem_category_name(static_cast<MemCategory>(c));
      if (r.peaks[q][static_cast<int>(MemCategory::quantized)] > 0) ++holders;
    }
    // One copy per node (8 ranks on one machine, or 8 / ranks_per_node
    // nodes), or one per rank.
    const size_t expect = std::string(l.share) == "per_rank" ? 8
                          : l.ranks_per_node > 0     ? 8 / l.ranks_per_node
                                                     : 1;
    EXPECT_EQ(holders, expect);
  }
}

TEST_F(LoraTraining, EveryRankSeesTheSameBase) {
  for (int rpn : {0, 4, 2, 1}) {
    const RunConfig cfg = config({8, 1, 1, 0, "1f1b", "none", rpn}, 8);
    const ProcessMesh mesh(MPI_COMM_WORLD, MeshLayout(8, 1, 1), rpn);
    const auto shared = load::FrozenBase::load(cfg.model, cfg.quant, cfg.train.seed, mesh);
    quant::QuantConfig priv = cfg.quant;
    priv.share = quant::ShareMode::per_rank;
    const auto own = load::FrozenBase::load(cfg.model, priv, cfg.train.seed, mesh);
    const uint64_t mine = view_checksum(*shared), reference = view_checksum(*own);
    std::vector<uint64_t> all(world_size());
    MPI_Gather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    int holder = shared->store().holder() ? 1 : 0, holders = 0;
    MPI_Reduce(&holder, &holders, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    // Ranks of one node see one segment: the same address range in the window.
    if (world_rank() != 0) continue;
    SCOPED_TRACE("ranks_per_node " + std::to_string(rpn));
    for (int q = 0; q < world_size(); ++q) EXPECT_EQ(all[q], reference) << "rank " << q;
    EXPECT_EQ(holders, rpn == 0 ? 1 : 8 / rpn);
  }
}

TEST_F(LoraTraining, BadBaseIsOneClearErrorOnEveryRank) {
  const RunConfig cfg = config({8, 1, 1, 0, "1f1b", "none", 4}, 8,
                               {"--quant.base=" + (dir_ / "missing.safetensors").string()});
  const ProcessMesh mesh(MPI_COMM_WORLD, MeshLayout(8, 1, 1), 4);
  try {
    load::FrozenBase::load(cfg.model, cfg.quant, cfg.train.seed, mesh);
    ADD_FAILURE() << "no error";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos) << e.what();
  }
}

// finetune.mode = full with quant.base: the whole model starts from the
// given weights, read by every rank for its shard. A file holding GPT-2's
// initialisation from train.seed gives the same run as no file, on one rank
// bit for bit and on dp 2 x tp 2 x pp 2 within the tolerance; other weights
// give another run.
TEST_F(LoraTraining, FullTrainingStartsFromTheBase) {
  const RunConfig cfg = config({1, 1, 1, 0, "1f1b", "none"}, 1);
  const std::string same = (dir_ / "init21.h5").string(), other = (dir_ / "init99.h5").string();
  if (world_rank() == 0) {
    for (auto [path, seed] : {std::pair{same, cfg.train.seed}, std::pair{other, int64_t{99}}}) {
      GPT g(cfg.model);
      g.init_weights(seed);
      load::write_params_h5(path, cfg.model,
                          std::vector<float>(g.params(), g.params() + g.num_params()));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::vector<std::string> full = {"--finetune.mode=full"};
  auto with_base = [&](const std::string& p) {
    return std::vector<std::string>{"--finetune.mode=full", "--quant.base=" + p};
  };
  const RunResult plain = train({1, 1, 1, 0, "1f1b", "none"}, full);
  const RunResult from_file = train({1, 1, 1, 0, "1f1b", "none"}, with_base(same));
  const RunResult sharded = train({2, 2, 2, 0, "1f1b", "none"}, with_base(same));
  const RunResult from_other = train({1, 1, 1, 0, "1f1b", "none"}, with_base(other));
  if (world_rank() != 0) return;
  EXPECT_EQ(from_file.losses, plain.losses);
  EXPECT_EQ(from_file.params, plain.params);
  for (size_t i = 0; i < plain.losses.size(); ++i)
    EXPECT_NEAR(sharded.losses[i], plain.losses[i], kLossTol * plain.losses[i]);
  EXPECT_LE(norm_rel(sharded.params, plain.params), kAdapterTol);
  EXPECT_NE(from_other.losses.front(), plain.losses.front());
}

// A tensor that cannot be read in the middle of the stream (its data lives in
// a missing external file, which only a read finds out): the leaders are told
// and stop waiting, and every rank gets one error naming the file.
TEST_F(LoraTraining, AFailureWhileStreamingIsOneErrorOnEveryRank) {
  const std::string path = (dir_ / "broken.h5").string();
  const RunConfig cfg0 = config({8, 1, 1, 0, "1f1b", "none", 2}, 8);
  if (world_rank() == 0) {
    GPT g(cfg0.model);
    g.init_weights(1);
    load::write_params_h5(path, cfg0.model,
                        std::vector<float>(g.params(), g.params() + g.num_params()));
    // Replace one tensor halfway through the table by a dataset whose bytes
    // are in a file that does not exist.
    const ParamSpec& p = g.spec("h.1.mlp.c_fc.weight");
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, ("params/" + p.name).c_str(), H5P_DEFAULT);
    hsize_t dims[2] = {static_cast<hsize_t>(p.full_shape.dims[0]),
                       static_cast<hsize_t>(p.full_shape.dims[1])};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, (dir_ / "missing.bin").c_str(), 0, p.numel() * sizeof(float));
    hid_t d = H5Dcreate2(f, ("params/" + p.name).c_str(), H5T_NATIVE_FLOAT, space, H5P_DEFAULT,
                         dcpl, H5P_DEFAULT);
    EXPECT_GE(d, 0);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const RunConfig cfg = config({8, 1, 1, 0, "1f1b", "none", 2}, 8, {"--quant.base=" + path});
  const ProcessMesh mesh(MPI_COMM_WORLD, MeshLayout(8, 1, 1), 2);
  try {
    load::FrozenBase::load(cfg.model, cfg.quant, cfg.train.seed, mesh);
    ADD_FAILURE() << "no error";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("broken.h5"), std::string::npos) << e.what();
  }
}
