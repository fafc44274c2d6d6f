// A checkpoint's /meta (docs/formats.md, "Checkpoints"): its one writer and
// its one reader, used by training (save and resume), `meshlm ckpt import`
// and the `meshlm ckpt` tools that interpret it. The values stay as the file
// holds them (numbers and text); what they mean to a run (a LinearSlots, a
// QuantType, a RunConfig to compare with) is the caller's.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>

#include "io/checkpoint_file.h"

namespace meshlm::io::ckpt {

// finetune_mode = "lora": the adapters and the base they were trained on.
struct LoraMeta {
  int64_t rank = 0;
  double alpha = 0;
  std::string targets;     // the linear layers, as finetune.lora_targets spells them
  std::string quant_type;  // "int8" or "nf4"
  std::string quant_base;  // the base file as the run named it ("": GPT-2's initialisation)
  std::string base_hash;   // its XXH3-128 ("" for the initialisation)
};

// Where a training run stood besides its tensors and its step counters:
// what resume restores and checks. A checkpoint of `meshlm ckpt import` has
// none.
struct RunMeta {
  int64_t skipped_steps = 0, overflow_steps = 0;
  double loss_scale = 1;
  int64_t loss_scale_good_steps = 0;
  uint64_t data_epoch = 0, data_position = 0, data_windows_per_epoch = 0;
  int64_t data_seq_len = 0;
  bool data_shuffle = false;
  std::string data_path;
  int64_t layout_dp = 1, layout_tp = 1, layout_pp = 1, layout_zero_stage = 0,
          layout_micro_batches = 1;
};

// model arch = "llama": what the model adds to its sizes (model/gpt_config.h).
struct LlamaMeta {
  int64_t n_kv_head = 0, intermediate_size = 0, tie_word_embeddings = 1;
  double norm_eps = 0, rope_theta = 0;
  double rope_factor = 0, rope_low_freq_factor = 0, rope_high_freq_factor = 0;
  int64_t rope_original_max_positions = 0;
};

struct Meta {
  ModelSizes sizes;
  std::string arch = "gpt2";      // the model family ("gpt2" where /meta names none)
  std::optional<LlamaMeta> llama;  // arch "llama"
  std::string created, config;  // written (write_identity); not read back
  std::optional<LoraMeta> lora;  // finetune_mode "lora" when set, else "full"
  int64_t step = 0, tokens_seen = 0, adamw_step = 0;
  std::optional<int64_t> seed;  // train.seed of the run (GPT-2's initialisation, the data order)
  std::optional<RunMeta> run;
  // The Hugging Face config.json keys of the model's directory that an export
  // writes back (load::HfDirectory::kept: its token ids, a Llama's context),
  // a JSON object; "" when the model came from no directory (no attribute).
  std::string hf_config;
};

// Writes /meta and the root's identity attributes (write_identity, then the
// rest); every writer of a checkpoint goes through it. Collective for a
// parallel file (every rank the same values).
void write_meta(hid_t file, const Meta& m);

// Reads /meta of `file` (`path` names it in errors), checking what it reads:
// kind and format_version, the model sizes in [1, 2^31), arch gpt2 (or
// none) or llama with every one of its attributes, finetune_mode full
// or lora, the LoRA attributes under lora (a rank >= 1, a positive finite
// alpha), step; tokens_seen, adamw_step and seed where they are there (0,
// 0, none otherwise); `run` where /meta has a loss_scale (a training
// checkpoint), every one of its attributes and tokens_seen, adamw_step and
// seed then required; 0 <= adamw_step <= step, tokens_seen >= 0 and a
// positive finite loss scale; the root's model sizes, where there, equal to
// /meta's. A training checkpoint's counters as training keeps them:
// skipped_steps and overflow_steps in [0, step], adamw_step = step -
// skipped_steps - overflow_steps, loss_scale_good_steps in [0, adamw_step],
// data_position below data_windows_per_epoch (>= 1) and the cursor within
// what step + 1 batches of at most 2^31 - 1 windows can have read.
// RankError naming the file and the attribute otherwise.
Meta read_meta(hid_t file, const std::string& path);

}  // namespace meshlm::io::ckpt
