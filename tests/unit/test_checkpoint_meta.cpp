// A checkpoint's /meta (io/checkpoint_meta.h): what write_meta writes, read
// back by read_meta and independently by the HDF5 attributes themselves;
// the forms the writers make (training's, with a LoRA part; import's,
// without a run); and each refusal of read_meta naming the file and the
// attribute.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "expect_error.h"
#include "io/checkpoint_meta.h"
#include "io/h5.h"
#include "scratch_dir.h"

using namespace meshlm;
namespace ck = meshlm::io::ckpt;
namespace h5 = meshlm::io::h5;

namespace {

using CheckpointMeta = ScratchDirTest;

ck::Meta training_meta(bool lora) {
  ck::Meta m;
  m.sizes = {3, 4, 64, 1000, 128};
  m.created = "2026-11-27T00:00:00Z";
  m.config = "[model]\nn_layer = 3\n";
  if (lora) m.lora = ck::LoraMeta{8, 16.0, "qkv,mlp-down", "nf4", "base.safetensors", "abc123"};
  m.step = 40;
  m.tokens_seen = 40 * 512;
  m.adamw_step = 37;  // step less skipped_steps and overflow_steps (read_meta checks it)
  m.seed = 1337;
  m.run = ck::RunMeta{.skipped_steps = 2, .overflow_steps = 1, .loss_scale = 32768.0,
                      .loss_scale_good_steps = 7, .data_epoch = 1, .data_position = 99,
                      .data_windows_per_epoch = 1234, .data_seq_len = 64, .data_shuffle = true,
                      .data_path = "tokens.bin", .layout_dp = 2, .layout_tp = 2, .layout_pp = 1,
                      .layout_zero_stage = 1, .layout_micro_batches = 4};
  return m;
}

}  // namespace

TEST_F(CheckpointMeta, TrainingMetaRoundTripsAndIsWhatTheFileHolds) {
  for (bool lora : {false, true}) {
    SCOPED_TRACE(lora ? "lora" : "full");
    const ck::Meta want = training_meta(lora);
    {
      h5::File f = h5::create_file(file("m.h5"));
      ck::write_meta(f, want);
    }
    h5::File f = h5::open_file(file("m.h5"));
    const ck::Meta got = ck::read_meta(f, file("m.h5"));
    EXPECT_EQ(got.sizes.n_layer, 3);
    EXPECT_EQ(got.sizes.n_head, 4);
    EXPECT_EQ(got.sizes.n_embd, 64);
    EXPECT_EQ(got.sizes.vocab_size, 1000);
    EXPECT_EQ(got.sizes.max_seq_len, 128);
    EXPECT_EQ(got.step, 40);
    EXPECT_EQ(got.tokens_seen, 40 * 512);
    EXPECT_EQ(got.adamw_step, 37);
    ASSERT_TRUE(got.seed.has_value());
    EXPECT_EQ(*got.seed, 1337);
    ASSERT_TRUE(got.run.has_value());
    EXPECT_EQ(got.run->skipped_steps, 2);
    EXPECT_EQ(got.run->overflow_steps, 1);
    EXPECT_EQ(got.run->loss_scale, 32768.0);
    EXPECT_EQ(got.run->loss_scale_good_steps, 7);
    EXPECT_EQ(got.run->data_epoch, 1u);
    EXPECT_EQ(got.run->data_position, 99u);
    EXPECT_EQ(got.run->data_windows_per_epoch, 1234u);
    EXPECT_EQ(got.run->data_seq_len, 64);
    EXPECT_TRUE(got.run->data_shuffle);
    EXPECT_EQ(got.run->data_path, "tokens.bin");
    EXPECT_EQ(got.run->layout_dp, 2);
    EXPECT_EQ(got.run->layout_tp, 2);
    EXPECT_EQ(got.run->layout_zero_stage, 1);
    EXPECT_EQ(got.run->layout_micro_batches, 4);
    EXPECT_EQ(got.lora.has_value(), lora);
    if (lora) {
      EXPECT_EQ(got.lora->rank, 8);
      EXPECT_EQ(got.lora->alpha, 16.0);
      EXPECT_EQ(got.lora->targets, "qkv,mlp-down");
      EXPECT_EQ(got.lora->quant_type, "nf4");
      EXPECT_EQ(got.lora->quant_base, "base.safetensors");
      EXPECT_EQ(got.lora->base_hash, "abc123");
    }
    // The attributes themselves, as docs/formats.md names them.
    h5::Group meta = h5::open_group(f, "meta");
    EXPECT_EQ(h5::read_string_attr(meta, "kind"), ck::kKind);
    EXPECT_EQ(h5::read_string_attr(meta, "finetune_mode"), lora ? "lora" : "full");
    EXPECT_EQ(h5::read_string_attr(meta, "config"), want.config);
    EXPECT_EQ(h5::read_scalar_attr<int64_t>(meta, "layout_world"), 4);
    EXPECT_EQ(h5::read_scalar_attr<uint64_t>(meta, "data_position"), 99u);
    EXPECT_EQ(h5::read_scalar_attr<int64_t>(f, "n_embd"), 64);  // the root's copy
    EXPECT_EQ(h5::has_attr(meta, "lora_rank"), lora);
  }
}

// `meshlm ckpt import`: a full model at step 0, no seed and no run.
TEST_F(CheckpointMeta, AnImportHasNoRun) {
  ck::Meta m;
  m.sizes = {2, 2, 32, 100, 16};
  {
    h5::File f = h5::create_file(file("i.h5"));
    ck::write_meta(f, m);
  }
  h5::File f = h5::open_file(file("i.h5"));
  const ck::Meta got = ck::read_meta(f, file("i.h5"));
  EXPECT_FALSE(got.run.has_value());
  EXPECT_FALSE(got.seed.has_value());
  EXPECT_FALSE(got.lora.has_value());
  EXPECT_EQ(got.step, 0);
  h5::Group meta = h5::open_group(f, "meta");
  EXPECT_TRUE(h5::has_attr(meta, "tokens_seen"));
  EXPECT_FALSE(h5::has_attr(meta, "loss_scale"));
}

// Each refusal names the file and what is wrong with /meta.
TEST_F(CheckpointMeta, RefusalsNameTheFileAndTheAttribute) {
  struct Case {
    const char* name;
    std::function<void(hid_t file, hid_t meta)> spoil;
    std::string says;
  };
  const Case cases[] = {
      {"kind", [](hid_t, hid_t m) { h5::write_string_attr(m, "kind", "something else"); },
       "not a meshlm checkpoint"},
      {"version", [](hid_t, hid_t m) { h5::write_scalar_attr<int64_t>(m, "format_version", 2); },
       "format_version = 2; this meshlm reads version 1"},
      {"size", [](hid_t, hid_t m) { h5::write_scalar_attr<int64_t>(m, "n_head", 0); },
       "'n_head' = 0 is not a model size"},
      {"mode", [](hid_t, hid_t m) { h5::write_string_attr(m, "finetune_mode", "half"); },
       "finetune_mode is 'half', neither 'full' nor 'lora'"},
      {"rank", [](hid_t, hid_t m) { h5::write_scalar_attr<int64_t>(m, "lora_rank", 0); },
       "lora_rank = 0 is not a rank"},
      {"alpha", [](hid_t, hid_t m) { h5::write_scalar_attr<double>(m, "lora_alpha", -1.0); },
       "lora_alpha = -1 is not positive"},
      {"state", [](hid_t, hid_t m) { h5::write_scalar_attr<int64_t>(m, "adamw_step", 41); },
       "impossible state (step 40, adamw_step 41"},
      {"scale", [](hid_t, hid_t m) { h5::write_scalar_attr<double>(m, "loss_scale", 0.0); },
       "impossible state"},
      {"missing", [](hid_t, hid_t m) { H5Adelete(m, "data_path"); },
       "/meta has no attribute 'data_path'"},
      {"missing lora", [](hid_t, hid_t m) { H5Adelete(m, "base_hash"); },
       "/meta has no attribute 'base_hash'"},
      {"no meta", [](hid_t f, hid_t) { H5Ldelete(f, "meta", H5P_DEFAULT); },
       "no /meta group: not a meshlm checkpoint"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const std::string path = file(std::string(k.name) + ".h5");
    {
      h5::File f = h5::create_file(path);
      ck::write_meta(f, training_meta(/*lora=*/true));
      h5::Group meta = h5::open_group(f, "meta");
      k.spoil(f, meta);
    }
    h5::File f = h5::open_file(path);
    expect_error([&] { ck::read_meta(f, path); }, {path, k.says});
  }
}
